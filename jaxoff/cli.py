"""``jaxoff <command>``: thin over the library; each command is a frozen dataclass + a runner.

Commands register in :data:`COMMANDS`; options are parsed by tyro from the dataclass
fields (``--help`` lists them all with their docs), defaults may come from a TOML file
given with ``--config``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import tyro

from ._errors import JaxoffError


@dataclasses.dataclass(frozen=True)
class Command:
    config_type: type
    run: Callable[[Any], Any]
    help: str
    load_file: Callable[[str], dict] | None = None


def _train() -> Command:
    from .train import TrainConfig, load_config_file, train

    return Command(TrainConfig, train, HELP["train"], load_config_file)


def _compare() -> Command:
    from .compare import CompareConfig, compare

    return Command(CompareConfig, compare, HELP["compare"])


def _plan() -> Command:
    from .plan import PlanConfig, run

    return Command(PlanConfig, run, HELP["plan"])


def _io_bench() -> Command:
    from ._iobench import IOBenchConfig, run

    return Command(IOBenchConfig, run, HELP["io-bench"])


# name -> factory (imports stay lazy so `jaxoff --help` is fast)
COMMANDS: dict[str, Callable[[], Command]] = {
    "train": _train,
    "compare": _compare,
    "io-bench": _io_bench,
    "plan": _plan,
}


# name -> one line of help, known without importing the command (so `jaxoff --help` is fast)
HELP: dict[str, str] = {
    "train": "train a model (a size name or your own) on a byte-level or tokenized corpus",
    "compare": "compare remat/offload policies or strategies: memory, host bytes, FLOPs, time",
    "io-bench": "measure the async I/O engine (and fio); --tune picks knobs",
    "plan": "choose remat/offload/placement under memory budgets",
}


def _usage() -> str:
    lines = ["usage: jaxoff <command> [--help] [options]", "", "commands:"]
    for name in COMMANDS:
        lines.append(f"  {name:<10} {HELP[name]}")
    return "\n".join(lines)


def _pop_config(argv: list[str]) -> tuple[str | None, list[str]]:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"jaxoff: error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    command = COMMANDS[name]()
    try:
        config_path, rest = _pop_config(rest)
        default = command.config_type()
        if config_path is not None and command.load_file is not None:
            default = command.config_type(**command.load_file(config_path))
        config = tyro.cli(
            command.config_type,
            args=rest,
            default=default,
            prog=f"jaxoff {name}",
            description=command.help
            + (" (defaults may come from --config FILE.toml)" if command.load_file else ""),
        )
        if hasattr(config, "validate"):
            config = config.validate()
        command.run(config)
    except JaxoffError as e:
        print(f"jaxoff {name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxoff {name}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
