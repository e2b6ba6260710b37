"""``cuzk-supervisor run``: the container's entrypoint — the whole lifecycle, then keep proving.

Register with the manager, make sure the parameters are on disk, plan the workers from the
memory limit, warm up, restart at full workers, settle, benchmark, report the rate, and keep the
daemon up until a signal (or until the manager has killed this instance). Every setting is a
flag, a ``CUZK_SUPERVISOR_*`` variable or a key of ``--config-file``; see ``config``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from cuzk_supervisor import settings
from cuzk_supervisor.cli import observe

# Everything else is imported by the functions that use it, not here: ``run --help`` and
# ``sim --help`` load this module, and the lifecycle behind it (``cuzk_supervisor.compose``) loads
# gRPC, protobuf, httpx and prometheus_client (see bench/entrypoint.py).
if TYPE_CHECKING:
    from cuzk_supervisor.compose import Machine
    from cuzk_supervisor.runtime import Runtime
    from cuzk_supervisor.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "run", help="the entrypoint: the whole lifecycle, then keep proving", description=__doc__
    )
    settings.add_flags(parser)
    observe.add_view_flags(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    loaded = settings.from_namespace(args)
    # The simulator's machine when the daemon is the simulated one, else the host's: the sim
    # command hands it in (the one module outside sim/ that knows the simulator).
    from cuzk_supervisor.cli.commands.sim import machine_for

    return run_lifecycle(loaded.settings, os.environ, machine_for(os.environ), verbose=args.verbose)


def check_inputs(s: Settings, environ: Mapping[str, str], machine: Machine) -> list[str]:
    """Everything that can be refused before anything starts (exit 2, nothing registered,
    started or written): see ``cuzk_supervisor.cli.prestart``. Returns the warnings to log."""
    # Here, not at the top: the checks read the C1 envelope (protobuf) and the daemon config.
    from cuzk_supervisor.cli import prestart

    return prestart.check_before_start(s, environ, machine=machine)


def run_lifecycle(
    s: Settings,
    environ: Mapping[str, str],
    machine: Machine,
    *,
    on_phase: Callable[[str], None] | None = None,
    command: str = "run",
    verbose: bool = False,
    keep_children: Iterable[int] = (),
) -> int:
    """The lifecycle under PID-1 duties, as the composition root (``cuzk_supervisor.compose``)
    builds it on ``machine``'s probes. ``keep_children``: children the caller started and stops
    itself afterwards (``sim``'s manager), left alone by the runtime."""
    warnings = check_inputs(s, environ, machine)
    # The lifecycle and its edges only now that the inputs passed, not when this module is
    # imported (``run --help``): they load gRPC, protobuf, httpx and the state and log adapters.
    import structlog

    from cuzk_supervisor import compose
    from cuzk_supervisor.adapters.logship.lines import shipping_processor
    from cuzk_supervisor.core.labels import label_warning
    from cuzk_supervisor.runtime import run_supervised

    edges = compose.open_edges(s, environ)
    json_logs = {"auto": None, "json": True, "console": False}[s.log_format]
    view = observe.lifecycle_view(s, command=command, min_rate=edges.min_rate, verbose=verbose)
    observe.configure_logging(
        s.log_level,
        json=json_logs,
        extra_processors=[shipping_processor(edges.shipper)],
        view=view,
    )
    for warning in warnings:
        structlog.get_logger().warning("settings.public_listen", detail=warning)
    unmatchable = label_warning(edges.label, s.manager_url)  # once, at start (run and sim)
    if unmatchable is not None:
        structlog.get_logger().warning("label.unmatchable", label=edges.label, detail=unmatchable)

    async def body(rt: Runtime) -> int:
        return await compose.run(s, rt, edges, machine, on_phase=on_phase)

    return observe.finish_view(
        run_supervised(body, cleanup_grace_s=s.daemon_stop_grace_s, keep_children=keep_children)
    )
