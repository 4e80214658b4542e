"""Errors by type, flags by table: the packages below the commands (the engine, nn, the
optimizer, policies, placements, the step, strategies, distributed, the models) name Python
options in their messages (`` `page_params=True` ``, `` `clip_norm=0` ``: `JaxoffError.options`)
and no command-line flag; ``jaxoff`` says each option as its command's flag, from one table
(`jaxoff.cli.flag_table`)."""

import ast
import re
from pathlib import Path

import pytest

from jaxoff import cli
from jaxoff._errors import OptionError
from jaxoff.optim import NotElementwiseError
from jaxoff.optim._plan import check_index_range

ROOT = Path(__file__).resolve().parent.parent
BELOW_THE_COMMANDS = [
    "aio", "nn", "optim", "policy", "placement", "step", "strategies", "distributed", "models",
]  # fmt: skip
# the launch command's own parser; a pip command line; XLA's flags
NOT_OURS = {"jaxoff/distributed/_launch.py", "jaxoff/aio/_cuda.py"}
# a command line to run (the launcher that sets the environment it asks for), not an option
EXAMPLES = {("jaxoff/distributed/_runtime.py", "--processes")}
FLAG = re.compile(r"(?<![\w-])--(?!xla_)[a-z][a-z-]*")


def _modules() -> list[str]:
    out = []
    for package in BELOW_THE_COMMANDS:
        out += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "jaxoff" / package).rglob("*.py"))]
    return [m for m in out if m not in NOT_OURS]


def _message_strings(path: Path):
    """String constants (f-string parts too) that are not docstrings (of modules, classes,
    functions or attributes: a string that is a statement of its own)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value


def test_the_scan_covers_every_package_below_the_commands():
    assert len(_modules()) > 80
    assert {m.split("/")[1] for m in _modules()} == set(BELOW_THE_COMMANDS)


@pytest.mark.parametrize("module", _modules())
def test_library_messages_name_no_flag(module):
    found = [
        f"{module}:{line}: {FLAG.search(text).group()}"
        for line, text in _message_strings(ROOT / module)
        if FLAG.search(text) and (module, FLAG.search(text).group()) not in EXAMPLES
    ]
    assert not found, "\n".join(found)


def test_an_option_error_names_its_options_and_the_cli_says_them_as_flags():
    e = OptionError(
        "`page_params=True` needs `fuyou=True`; pass `clip_norm=0` or `store='none'`, "
        "`chunk_bytes=3145728`, or `resume=False`; `not_an_option` stays"
    )
    assert e.options == (
        "page_params", "fuyou", "clip_norm", "store", "chunk_bytes", "resume", "not_an_option",
    )  # fmt: skip
    assert cli.said_with_flags("train", e) == (
        "--page-params needs --fuyou; pass --clip-norm 0 or --store none, --chunk-mib 3, or "
        "--no-resume; `not_an_option` stays"
    )
    # another command's table: its own options (compare has --device-mem, no --fuyou)
    other = OptionError("raise `device_mem` or lower `batch_size`; `fuyou=True`")
    assert cli.said_with_flags("compare", other) == (
        "raise --device-mem or lower --batch-size; `fuyou=True`"
    )


def test_every_train_option_has_a_flag_in_the_table():
    from jaxoff.train import FLAT_NAMES

    table = cli.flag_table("train")
    assert set(FLAT_NAMES) <= set(table)
    assert table["fuyou_read_ahead_mib"][0] == "--fuyou-read-ahead-mib"
    flag, convert = table["chunk_bytes"]  # a library option the train flag sets in MiB
    assert (flag, convert(str(8 << 20)), convert(str((8 << 20) + 1))) == ("--chunk-mib", "8", "9")


def test_a_library_error_reported_by_the_cli_names_the_flag(tmp_path, capsys):
    """From a real refusal: the strategy's check names `page_params` and `fuyou` in Python,
    and `jaxoff train` prints them as its flags."""
    from jaxoff.strategies.fuyou import FuyouOptions

    with pytest.raises(OptionError) as e:
        FuyouOptions(page_params=True).check()
    assert e.value.options == ("page_params", "fuyou") and "--" not in str(e.value)
    code = cli.main(["train", "--model", "tiny", "--page-params", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("jaxoff train: error: --page-params pages the")
    assert err[-1].endswith("add --fuyou") and not any(tmp_path.iterdir())


def test_a_range_error_names_the_python_alternative():
    with pytest.raises(NotElementwiseError) as e:
        check_index_range("w", 2**31, 1 << 20)
    message = str(e.value)
    assert "jaxoff.strategies.fuyou" in message and "--" not in message
