"""``cuzk-supervisor`` command line: one subcommand per module in
``cuzk_supervisor.cli.commands``.

Only the module of the command given is imported (``COMMANDS`` names the others with their one
line, for ``--help`` and the invalid-choice error): ``config`` or ``healthcheck`` does not load
the lifecycle, gRPC or the simulator, and ``run`` loads only what it uses.

Every command ends here: a bad setting is one line and exit 2 (``UsageError``), Ctrl-C is
128 + SIGINT, and a closed stdout (``cuzk-supervisor config --json | head -1``) ends quietly
with 141, 128 + SIGPIPE, as a shell tool killed by SIGPIPE does (Python ignores SIGPIPE: the
write raises ``BrokenPipeError``; stdout then goes to /dev/null, so that the last flush at exit
prints no second traceback).

``entry`` is the program: ``main``, then the exit; ``run`` and ``sim`` skip the interpreter's
teardown when nothing is left to settle (``runtime.end_settled``), so that their stop after
SIGTERM is not also 0.1 s of module cleanup and grpc's shutdown after the last log line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NoReturn

from cuzk_supervisor import exitcodes
from cuzk_supervisor.cli.parser import CommandParser
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.version import VERSION

CLOSED_PIPE = exitcodes.SIGNAL_BASE + signal.SIGPIPE
PACKAGE = "cuzk_supervisor.cli.commands"


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand; ``help`` is its module's own ``add_parser(help=...)`` (a test compares)."""

    name: str
    help: str
    more: str  # where to read more: the last line of the command's ``--help``
    settled_exit: bool = False  # the program ends without the interpreter's teardown (``entry``)

    @property
    def module(self) -> str:
        return f"{PACKAGE}.{self.name}"


COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "the entrypoint: the whole lifecycle, then keep proving",
        'README.md, "When a machine fails"; docs/lifecycle.md; docs/configuration.md',
        settled_exit=True,
    ),
    Command(
        "sim",
        "run the whole lifecycle against the simulator",
        "docs/commands.md; docs/simulator.md; docs/sim-manager.md",
        settled_exit=True,
    ),
    Command(
        "prove",
        "run one proof or a small batch against a daemon and report the rate",
        'docs/commands.md; docs/benchmark.md, "What bounds the rate"',
    ),
    Command(
        "daemon",
        "keep only the daemon up as a supervised child",
        "docs/daemon.md; docs/configuration.md",
    ),
    Command(
        "plan",
        "print the worker plan for this machine and why",
        'docs/daemon.md, "Measured figures"; docs/configuration.md',
    ),
    Command(
        "doctor",
        "check this machine before a run (GPUs, memory, disk, folders, ports, manager)",
        'README.md, "When a machine fails"',
    ),
    Command("config", "print the effective settings and their sources", "docs/configuration.md"),
    Command(
        "healthcheck",
        "probe the running supervisor's health server (the container's HEALTHCHECK)",
        "docs/observability.md",
    ),
)
MORE = "Read more in the source tree: {}."


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The command line; ``load``: the commands whose modules are imported and registered (all
    when None); the others are only listed (name and help line, no flags)."""
    parser = CommandParser(
        prog="cuzk-supervisor",
        description="Supervisor for a cuzk GPU proving instance.",
        epilog=MORE.format("README.md; docs/commands.md"),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        if load is None or command.name in load:
            importlib.import_module(command.module).register(sub)
            sub.choices[command.name].epilog = MORE.format(command.more)
        else:
            sub.add_parser(command.name, help=command.help, add_help=False)
    return parser


def command_in(argv: Sequence[str]) -> list[str]:
    """The command ``argv`` names (its first word, as the top-level parser has no options but
    ``--help``), as the list for ``build_parser``: empty for ``--help``, none or a typo."""
    names = {command.name for command in COMMANDS}
    return [argv[0]] if argv and argv[0] in names else []


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_in(given))
    try:
        args = parser.parse_args(given)
        try:
            code = int(args.handler(args))
        except UsageError as exc:
            print(f"cuzk-supervisor {args.command}: error: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        sys.stdout.flush()  # a closed pipe shows here, while it can still be handled
        return code
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE
    except KeyboardInterrupt:
        return exitcodes.SIGNAL_BASE + signal.SIGINT


def entry() -> NoReturn:
    given = sys.argv[1:]
    code = main(given)
    if any(c.settled_exit for c in COMMANDS if c.name in command_in(given)):
        from cuzk_supervisor import runtime  # loaded by run and sim already

        runtime.end_settled(code)  # returns only if something is not settled
    sys.exit(code)


if __name__ == "__main__":
    entry()
