"""The lifecycle as ``run`` and ``sim`` run it: the checks before the start, logging and the
view, then the composition root's graph under PID-1 duties.

Both commands call ``run_lifecycle`` with the machine they measure, so neither imports the
other. Nothing heavy at the top: ``run --help`` loads this, and ``cuzk_supervisor.compose``
loads gRPC, protobuf and the manager's HTTP client (see bench/entrypoint.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from cuzk_supervisor.cli import observe

if TYPE_CHECKING:
    from cuzk_supervisor.compose import Machine
    from cuzk_supervisor.runtime import Runtime
    from cuzk_supervisor.settings import Settings


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
    """``keep_children``: children the caller started and stops itself (``sim``'s manager)."""
    # Here, not at the top: the checks read the C1 envelope (protobuf) and the daemon config.
    from cuzk_supervisor.cli import prestart

    # Refused before anything is registered, started or written: exit 2.
    warnings = prestart.check_before_start(s, environ, machine=machine)
    # The lifecycle and its edges only now that the inputs passed (gRPC, protobuf, the manager
    # client, the state and log adapters).
    import structlog

    from cuzk_supervisor import compose, composeedges
    from cuzk_supervisor.adapters.logship.lines import shipping_processor
    from cuzk_supervisor.core.labels import label_warning
    from cuzk_supervisor.runtime import run_supervised

    edges = composeedges.open_edges(s, environ)
    json_logs = {"auto": None, "json": True, "console": False}[s.log_format]
    # The terminal view (and the modules that draw it) only where it can be shown.
    view = (
        observe.lifecycle_view(s, command=command, min_rate=edges.min_rate, verbose=verbose)
        if json_logs is None and observe.on_terminal()
        else None
    )
    shipper = shipping_processor(edges.shipper)
    observe.configure_logging(s.log_level, json=json_logs, extra_processors=[shipper], view=view)
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
