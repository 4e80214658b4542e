"""Library errors say what to change in Python (``chunk_bytes=``, ``jaxoff.paged``) and name no
command-line flag; ``jaxoff`` adds the flag of its command when it reports one."""

import ast
import re
from pathlib import Path

import pytest

from jaxoff import cli
from jaxoff.optim import NotElementwiseError
from jaxoff.optim._plan import check_index_range

ROOT = Path(__file__).resolve().parent.parent
# modules whose messages reach library users (not the CLI's own option parsing)
LIBRARY = ["jaxoff/optim/_plan.py", "jaxoff/placement/_apply.py", "jaxoff/placement/_jit.py"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _strings(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


@pytest.mark.parametrize("module", LIBRARY)
def test_library_messages_name_no_flag(module):
    found = [
        f"{module}:{line}: {FLAG.search(text).group()}"
        for line, text in _strings(ROOT / module)
        if FLAG.search(text)
    ]
    assert not found, "\n".join(found)


def test_the_cli_adds_the_flag_of_the_python_option():
    with pytest.raises(NotElementwiseError) as e:
        check_index_range("w", 2**31, 1 << 20)
    message = str(e.value)
    assert "jaxoff.strategies.fuyou" in message and "--" not in message
    assert cli._with_flags("train", message) == f"{message} (jaxoff train: --strategy fuyou)"
    ram = "pass chunk_bytes=8192 or more, or keep this optimizer in RAM"
    assert cli._with_flags("train", ram).endswith("(jaxoff train: --chunk-mib)")
    both = "page the optimizer state to a store (jaxoff.paged) or clipping (clip_norm=0)"
    assert cli._with_flags("train", both).endswith("(jaxoff train: --clip-norm 0, --store DIR)")
    # a message that names the flag already, and another command, are left as they are
    named = "--chunk-mib 0: chunk_bytes=0 is too small"
    assert cli._with_flags("train", named) == named
    assert cli._with_flags("plan", ram) == ram
