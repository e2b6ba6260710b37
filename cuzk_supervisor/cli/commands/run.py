"""``cuzk-supervisor run``: the container's entrypoint — the whole lifecycle, then keep proving.

Register with the manager, make sure the parameters are on disk, plan the workers from the
memory limit, warm up, restart at full workers, settle, benchmark, report the rate, and keep the
daemon up until a signal (or until the manager has killed this instance). Every setting is a
flag, a ``CUZK_SUPERVISOR_*`` variable or a key of ``--config-file``; see ``config``.
"""

from __future__ import annotations

import argparse
import os

from cuzk_supervisor import settings
from cuzk_supervisor.cli import observe

FLEET_SETTINGS = (
    "manager_url",
    "min_rate",
    "label",
    "manager_token",
    "params_fetch_command",
    "params_expected",
    "c1_file",
)
"""What a fleet sets (README, "The settings a fleet must set"), first in ``run --help``."""

# The lifecycle is imported by ``main``, not here: it loads gRPC, protobuf and the manager's
# HTTP client, and ``run --help`` loads this module (see bench/entrypoint.py).


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "run", help="the entrypoint: the whole lifecycle, then keep proving", description=__doc__
    )
    settings.add_flags(parser, first=FLEET_SETTINGS)
    observe.add_view_flags(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from cuzk_supervisor.cli.runlifecycle import run_lifecycle
    from cuzk_supervisor.cli.simhandoff import machine_for

    s = settings.from_namespace(args).settings
    return run_lifecycle(s, os.environ, machine_for(s, os.environ), verbose=args.verbose)
