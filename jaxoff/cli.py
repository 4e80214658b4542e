"""``jaxoff <command>``: thin over the library; each command is a frozen dataclass + a runner.

Commands register in :data:`COMMANDS`; options are parsed by tyro from the dataclass
fields (``--help`` lists them all with their docs), defaults may come from a TOML file
given with ``--config``.

A failure is one line on stderr, ``jaxoff <command>: error: <what happened>; <what to do>``:
bad input (a :class:`JaxoffError`, or an option tyro cannot parse) exits 2, a failing file
system (``OSError``: disk full, permission denied, ...) exits 1 naming the path, and an
unexpected exception (a bug) exits 1 saying so. ``--debug`` anywhere on the command line
(or ``JAXOFF_DEBUG=1``) prints the full traceback (or tyro's own report) as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any

import tyro

from . import _notices
from ._errors import OPTION, JaxoffError, UsageError, describe_os_error, say_options


@dataclasses.dataclass(frozen=True)
class Command:
    """A command: its config type (built from defaults or a file), its runner, its help, the
    reader of its ``--config`` file, and what tyro parses (default: the config type)."""

    config_type: type
    run: Callable[[Any], Any]
    help: str
    load_file: Callable[[str], dict] | None = None
    parsed_as: Any = None


def _train() -> Command:
    from .train import (  # heavy (jax): loaded when the command runs
        TrainConfig,
        load_config_file,
        train,
    )

    # the groups' options parse flat (--lr, not --optim-options.lr)
    parsed = Annotated[TrainConfig, tyro.conf.OmitArgPrefixes]
    return Command(TrainConfig, train, HELP["train"], load_config_file, parsed)


def _export() -> Command:
    from .train import ExportConfig, export_run  # heavy (jax): loaded when the command runs

    return Command(ExportConfig, export_run, HELP["export"])


def _compare() -> Command:
    from .compare import CompareConfig, compare  # heavy (jax): loaded when the command runs

    return Command(CompareConfig, compare, HELP["compare"])


def _plan() -> Command:
    from .plan import PlanConfig, run  # heavy (jax): loaded when the command runs

    return Command(PlanConfig, run, HELP["plan"])


def _io_bench() -> Command:
    from ._iobench import IOBenchConfig, run  # heavy (jax): loaded when the command runs

    return Command(IOBenchConfig, run, HELP["io-bench"])


def _launch() -> Command:
    from .distributed import LaunchSpec, launch  # heavy (jax): loaded when the command runs

    return Command(LaunchSpec, launch, HELP["launch"])


# name -> factory (imports stay lazy so `jaxoff --help` is fast)
COMMANDS: dict[str, Callable[[], Command]] = {
    "train": _train,
    "export": _export,
    "compare": _compare,
    "io-bench": _io_bench,
    "plan": _plan,
    "launch": _launch,
}


# name -> one line of help, known without importing the command (so `jaxoff --help` is fast)
HELP: dict[str, str] = {
    "train": "train a model (a size name or your own) on a byte-level or tokenized corpus",
    "export": "write a run's checkpoint as a Hugging Face folder (e.g. a run of --init-from)",
    "compare": "compare remat/offload policies or strategies: memory, host bytes, FLOPs, time",
    "io-bench": "measure the async I/O engine (and fio); --tune picks knobs",
    "plan": "choose remat/offload/placement under memory budgets",
    "launch": "run a command in N processes on this machine (jax.distributed), e.g. "
    "launch --processes 2 -- train --fsdp 4",
}


def _usage() -> str:
    lines = ["usage: jaxoff [--debug] <command> [--help] [options]", "", "commands:"]
    for name in COMMANDS:
        lines.append(f"  {name:<10} {HELP[name]}")
    lines += [
        "",
        "options:",
        "  --debug    on failure, print the full traceback (anywhere on the line; or "
        "JAXOFF_DEBUG=1)",
    ]
    return "\n".join(lines)


def _pop_config(argv: list[str]) -> tuple[str | None, list[str]]:
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 == len(argv):
                raise UsageError("--config needs a file: --config FILE.toml")
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, argv


def _pop_debug(argv: list[str]) -> tuple[bool, list[str]]:
    """``--debug`` wherever it is (before or after the command), and the rest."""
    rest = [a for a in argv if a != "--debug"]
    env = os.environ.get("JAXOFF_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return env or len(rest) < len(argv), rest


# tyro reports a parse error in a box: UTF-8 (a title in the top border, rules of ─) or ASCII
# (a title line, rules of -), wrapped to the terminal width
_BORDER = "│╭╮╰╯ \t"


def _tyro_message(report: str) -> str:
    """tyro's error box as one line: its message, reworded, and the options it suggests."""
    lines = [line.strip(_BORDER) for line in report.splitlines()]
    lines = [line for line in lines if line]
    if lines and not report.lstrip().startswith("╭"):
        lines = lines[1:]  # the ASCII box's title line
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        if line.startswith("─ "):  # the UTF-8 box's top border, with the title
            continue
        if not line.strip("-─ "):  # a rule
            if paragraphs[-1]:
                paragraphs.append([])
            continue
        paragraphs[-1].append(line)
    if not paragraphs[0]:
        return " ".join(report.split())
    text = " ".join(" ".join(paragraphs[0]).split())
    for pattern, replacement in _REWORDINGS:
        text = re.sub(pattern, replacement, text)
    for p in paragraphs[1:]:
        if p and p[0].startswith("Perhaps you meant"):
            options = [w for line in p[1:] for w in line.split()[:1] if w.startswith("-")]
            if options:
                text += f" (did you mean {' or '.join(dict.fromkeys(options))}?)"
    return text


# tyro's wording -> ours (one line: the option, what is wrong with the value, the choices)
_REWORDINGS = [
    (r"^Error parsing ", ""),
    (r"invalid literal for int\(\) with base 10: ('.*')$", r"\1 is not an integer"),
    (r"could not convert string to float: ('.*')$", r"\1 is not a number"),
    (
        r"^invalid choice ('.*') for argument '(\S+)'\. Expected one of \((.*)\)\.$",
        lambda m: f"{m[2]} {m[1]} is not a choice; choose one of {m[3].replace(chr(39), '')}",
    ),
    (r"^Missing value for argument '(\S+)'\..*$", r"\1 needs a value"),
    (r"^Unrecognized options: ", "unrecognized arguments: "),
]


def _parse(command: Command, name: str, args: list[str], default: Any, debug: bool) -> Any:
    """tyro parses ``args``; a parse error becomes a :class:`UsageError` of one line."""

    def cli():
        return tyro.cli(
            command.parsed_as or command.config_type,
            args=args,
            default=default,
            prog=f"jaxoff {name}",
            description=command.help
            + (
                "; --config FILE.toml: the defaults of these options from a TOML file's "
                "[train] table (options given here win)"
                if command.load_file
                else ""
            )
            + "; --debug prints the traceback of a failure",
        )

    report = io.StringIO()
    try:
        with contextlib.redirect_stderr(report):
            config = cli()
    except SystemExit as e:
        if e.code in (0, None):  # --help
            raise
        if debug:
            sys.stderr.write(report.getvalue())
        # render the report again without wrapping: one line must hold the whole message
        wide = io.StringIO()
        columns = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "100000"
        try:
            with contextlib.redirect_stderr(wide), contextlib.suppress(SystemExit):
                cli()
        finally:
            if columns is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = columns
        message = _tyro_message(wide.getvalue() or report.getvalue())
        raise UsageError(f"{message}; see jaxoff {name} --help") from None
    except BaseException:
        sys.stderr.write(report.getvalue())  # what tyro said before it failed
        raise
    sys.stderr.write(report.getvalue())  # tyro's warnings, if any
    return config


def _os_error(e: BaseException | None) -> OSError | None:
    """The ``OSError`` behind ``e`` (itself, or what it was raised from), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno is not None:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _run(name: str, command: Command, rest: list[str], debug: bool) -> int:
    if name == "launch":  # its options, then `--` and the command it runs in each process
        from .distributed import parse_launch_args  # heavy (jax): the launcher's own parser

        return command.run(parse_launch_args(rest))
    from .distributed import initialize_from_env  # heavy (jax): a command is running

    if name == "train":
        initialize_from_env()  # before anything touches a device
    elif int(os.environ.get("JAX_NUM_PROCESSES", "1") or 1) > 1:
        raise UsageError(
            f"JAX_NUM_PROCESSES is set: only jaxoff train runs across processes; run {name} "
            f"in one process (unset JAX_NUM_PROCESSES)"
        )
    config_path, rest = _pop_config(rest)
    if config_path is not None and command.load_file is None:
        raise UsageError(
            f"--config is an option of jaxoff train only; give the options of {name} on the "
            f"command line"
        )
    default = command.config_type()
    if config_path is not None:
        assert command.load_file is not None  # refused above otherwise
        default = command.config_type(**command.load_file(config_path))
    config = _parse(command, name, rest, default, debug)
    if hasattr(config, "validate") and name != "train":
        config = config.validate()  # train validates (and checks the rest) before writing
    command.run(config)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs ``jaxoff <command> [options]``; returns the exit status (0: done, 2: bad input,
    1: the file system failed or a bug, 130: interrupted).

    A process of a multi-process run that fails exits at once with its status: at exit,
    ``jax.distributed`` would otherwise wait for the other processes (which may be waiting
    for this one) and then abort, burying the one-line error. The launcher (or the cluster's)
    then stops the others."""
    code = _main(argv)
    if code != 0 and "jax" in sys.modules:
        import jax  # loaded by the command already (checked above)

        if jax.distributed.is_initialized() and jax.process_count() > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, argv = _pop_debug(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        if name.startswith("-"):
            what = f"unknown option {name!r} before the command (only --debug and --help go there)"
        else:
            what = f"unknown command {name!r}" + (f" (did you mean {near[0]}?)" if near else "")
        print(
            f"jaxoff: error: {what}; the commands are {', '.join(COMMANDS)} (see jaxoff --help)",
            file=sys.stderr,
        )
        return 2
    # notices (the I/O backend's, say) as `jaxoff: note: ...` lines, not WARNING:..., their
    # options said as this command's flags
    with _notices.as_lines(say=lambda line: said_with_flags(name, line)):
        return _command(name, rest, debug)


def _command(name: str, rest: list[str], debug: bool) -> int:
    """Runs the command ``name``; its exit status, any failure said in one line."""
    prefix = f"jaxoff {name}: error:"
    try:
        code = _run(name, COMMANDS[name](), rest, debug)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print(f"jaxoff {name}: interrupted", file=sys.stderr)
        return 130
    except JaxoffError as e:
        if debug and not isinstance(e, UsageError):
            traceback.print_exc()
        print(f"{prefix} {_one_line(said_with_flags(name, e))}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (the last word on any failure is one line)
        if debug:
            traceback.print_exc()
        os_error = _os_error(e)
        if os_error is not None:
            print(f"{prefix} {_one_line(describe_os_error(os_error))}", file=sys.stderr)
            return 1
        if isinstance(e, MemoryError):
            print(
                f"{prefix} out of memory; choose a smaller model or batch, or page the "
                f"optimizer state (--store) or offload activations (--policy)",
                file=sys.stderr,
            )
            return 1
        print(
            f"{prefix} internal error, a bug in jaxoff: {type(e).__name__}: {_one_line(e)}; "
            + (
                "please report it with the traceback above"
                if debug
                else f"rerun with --debug (jaxoff --debug {name} ...) for the traceback, and "
                f"report it"
            ),
            file=sys.stderr,
        )
        return 1
    return code


# Library errors name Python options (`page_params`, `clip_norm=0`: jaxoff._errors); the one
# table of the flags that set them: each command's own options by tyro's names (`lr` is
# --lr), and for train the library's options that a flag sets in other units.
_OTHER_UNITS: dict[str, dict[str, tuple[str, Callable[[str], str]]]] = {
    "train": {
        "chunk_bytes": ("--chunk-mib", lambda v: str(-(-int(v) // (1 << 20)))),
    },
}


def flag_table(name: str) -> dict[str, tuple[str, Callable[[str], str]]]:
    """Option -> (flag of ``jaxoff name``, converter of a value to the flag's units).

    >>> flag_table("train")["page_params"][0], flag_table("train")["chunk_bytes"][0]
    ('--page-params', '--chunk-mib')
    """
    if name == "train":
        from .train import FLAT_NAMES  # heavy (jax): only when a command has failed

        names = list(FLAT_NAMES)
    else:
        config_type = COMMANDS[name]().config_type
        names = [f.name for f in dataclasses.fields(config_type)]
    same = {n: ("--" + n.replace("_", "-"), str) for n in names}
    return same | _OTHER_UNITS.get(name, {})


def said_with_flags(name: str, message: str | JaxoffError) -> str:
    """``message`` (an error's, a notice's) with each option it names said as the flag of
    ``jaxoff name`` that sets it (`` `clip_norm=0` `` -> ``--clip-norm 0``, `` `fuyou=True` ``
    -> ``--fuyou``, `` `resume=False` `` -> ``--no-resume``); an option no flag sets stays as
    it is."""
    message = str(message)
    if not OPTION.search(message):
        return message
    table = flag_table(name)

    def flag_of(option: str, value: str | None) -> str | None:
        if option not in table:
            return None
        flag, convert = table[option]
        if value is None or value == "True":
            return flag
        if value == "False":
            return "--no-" + flag[2:]
        return f"{flag} {convert(value.strip(chr(39) + chr(34)))}"

    return say_options(message, flag_of)


def _one_line(e: BaseException | str) -> str:
    return " ".join(str(e).split()) if "\n" in str(e) else str(e)


if __name__ == "__main__":
    sys.exit(main())
