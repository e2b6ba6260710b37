"""``cuzk-supervisor config``: the effective settings and where each came from.

Secrets are redacted. Takes the same flags, environment and ``--config-file`` as ``run``.
"""

from __future__ import annotations

import argparse
import json

from cuzk_supervisor import settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "config", help="print the effective settings and their sources", description=__doc__
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    settings.add_flags(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    rows = settings.dump(settings.from_namespace(args))
    if args.json:
        print(json.dumps([{"name": n, "value": v, "source": s} for n, v, s in rows], indent=2))
        return 0
    width = max(len(name) for name, _, _ in rows)
    value_width = min(48, max(len(value) for _, value, _ in rows))
    for name, value, source in rows:
        print(f"{name:<{width}}  {value:<{value_width}}  {source}")
    return 0
