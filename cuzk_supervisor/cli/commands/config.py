"""``cuzk-supervisor config``: the effective settings, where each came from, secrets redacted.

Reads every setting as ``run`` does: the environment (CUZK_SUPERVISOR_*) and the settings file
(``--config-file``). Any of ``run``'s setting flags may be added to see what it would change
(see ``cuzk-supervisor run --help``); they are not listed here. Prints every setting as a table
(name, value, source) or, with ``--json``, as a list of objects whose values keep their types.
"""

from __future__ import annotations

import argparse
import json

from cuzk_supervisor import settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "config", help="print the effective settings and their sources", description=__doc__
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON (name, typed value, source, group)"
    )
    settings.add_flags(parser, (), unlisted=[d.name for d in settings.declarations()])
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    loaded = settings.from_namespace(args)
    if args.json:
        print(json.dumps(settings.dump_json(loaded), indent=2))
        return 0
    rows = settings.dump(loaded)
    width = max(len(name) for name, _, _ in rows)
    value_width = min(48, max(len(value) for _, value, _ in rows))
    for name, value, source in rows:
        print(f"{name:<{width}}  {value:<{value_width}}  {source}")
    return 0
