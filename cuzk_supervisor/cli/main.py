"""``cuzk-supervisor`` command line: one subcommand per module in
``cuzk_supervisor.cli.commands``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cuzk_supervisor import exitcodes
from cuzk_supervisor.cli.commands import COMMANDS, healthcheck
from cuzk_supervisor.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuzk-supervisor",
        description="Supervisor for a cuzk GPU proving instance.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (*COMMANDS, healthcheck):
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except UsageError as exc:
        print(f"cuzk-supervisor {args.command}: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except KeyboardInterrupt:
        return exitcodes.SIGNAL_BASE + 2


if __name__ == "__main__":
    sys.exit(main())
