"""``cuzk-supervisor`` command line: one subcommand per module in
``cuzk_supervisor.cli.commands``.

Every command ends here: a bad setting is one line and exit 2 (``UsageError``), Ctrl-C is
128 + SIGINT, and a closed stdout (``cuzk-supervisor config --json | head -1``) ends quietly
with 141, 128 + SIGPIPE, as a shell tool killed by SIGPIPE does: Python ignores SIGPIPE, so the
write raises ``BrokenPipeError`` instead; stdout is then pointed at /dev/null, so that the
interpreter's last flush at exit does not print a second traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from cuzk_supervisor import exitcodes
from cuzk_supervisor.cli.commands import COMMANDS, healthcheck
from cuzk_supervisor.cli.parser import CommandParser
from cuzk_supervisor.errors import UsageError

CLOSED_PIPE = exitcodes.SIGNAL_BASE + signal.SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cuzk-supervisor",
        description="Supervisor for a cuzk GPU proving instance.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (*COMMANDS, healthcheck):
        command.register(sub)
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is left in its buffer is dropped, not raised again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
