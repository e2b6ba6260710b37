"""``cuzk-supervisor run``: the container's entrypoint — the whole lifecycle, then keep proving.

Register with the manager, make sure the parameters are on disk, plan the workers from the
memory limit, warm up, restart at full workers, settle, benchmark, report the rate, and keep the
daemon up until a signal (or until the manager has killed this instance). Every setting is a
flag, a ``CUZK_SUPERVISOR_*`` variable or a key of ``--config-file``; see ``config``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from cuzk_supervisor import settings
from cuzk_supervisor.cli import observe
from cuzk_supervisor.cli.looks import STATE_FILE as STATE_FILE  # in state_dir

# Everything else is imported by the functions that use it, not here: ``run --help`` and
# ``sim --help`` load this module, and the lifecycle behind it loads gRPC, protobuf, httpx,
# prometheus_client and the doctor's checks (see bench/entrypoint.py).
if TYPE_CHECKING:
    from cuzk_supervisor.lifecycle.machine import Lifecycle
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
    return run_lifecycle(loaded.settings, os.environ, verbose=args.verbose)


def check_inputs(s: Settings, environ: Mapping[str, str]) -> list[str]:
    """Everything that can be refused before anything starts (exit 2, nothing registered,
    started or written): see ``cuzk_supervisor.cli.prestart``. Returns the warnings to log."""
    # Here, not at the top: the checks read the C1 envelope (protobuf) and the daemon config.
    from cuzk_supervisor.cli import prestart

    return prestart.check_before_start(s, environ)


def run_lifecycle(
    s: Settings,
    environ: Mapping[str, str],
    *,
    on_phase: Callable[[str], None] | None = None,
    command: str = "run",
    verbose: bool = False,
    keep_children: Iterable[int] = (),
) -> int:
    """The lifecycle under PID-1 duties. ``keep_children``: children the caller started and
    stops itself afterwards (``sim``'s manager), left alone by the runtime."""
    warnings = check_inputs(s, environ)
    # The lifecycle and its edges only now that the inputs passed, not when this module is
    # imported (``run --help``): they load gRPC, protobuf, httpx and the state and log adapters.
    import structlog

    from cuzk_supervisor import exitcodes
    from cuzk_supervisor.adapters.logship.lines import shipping_processor
    from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
    from cuzk_supervisor.adapters.manager.client import ManagerClient
    from cuzk_supervisor.adapters.manager.outbox import Outbox
    from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore, StateWriteError
    from cuzk_supervisor.core.labels import label_warning
    from cuzk_supervisor.lifecycle import assemble
    from cuzk_supervisor.lifecycle.wiring import build_lifecycle, resolve_label, resolve_min_rate
    from cuzk_supervisor.runtime import run_supervised
    from cuzk_supervisor.serve.metricsink import MetricsSink, NoMetrics

    label = resolve_label(s, environ)
    min_rate = resolve_min_rate(s, environ)
    manager = ManagerClient(
        s.manager_url or None,
        timeouts=assemble.manager_timeouts(s),
        retry=assemble.manager_retry(s),
        headers={"Authorization": f"Bearer {s.manager_token}"} if s.manager_token else None,
    )
    shipper = LogShipper(
        manager if s.log_push else None,
        ShipperSettings(max_buffer_lines=s.log_buffer_lines),
    )
    json_logs = {"auto": None, "json": True, "console": False}[s.log_format]
    view = observe.lifecycle_view(s, command=command, min_rate=min_rate, verbose=verbose)
    observe.configure_logging(
        s.log_level, json=json_logs, extra_processors=[shipping_processor(shipper)], view=view
    )
    for warning in warnings:
        structlog.get_logger().warning("settings.public_listen", detail=warning)
    unmatchable = label_warning(label, s.manager_url)  # once, at start (run and sim)
    if unmatchable is not None:
        structlog.get_logger().warning("label.unmatchable", label=label, detail=unmatchable)

    async def body(rt: Runtime) -> int:
        try:
            keeper = StateKeeper(StateStore(s.state_dir / STATE_FILE))
        except StateWriteError as exc:
            print(f"cuzk-supervisor run: {exc}", file=sys.stderr)
            return exitcodes.STATE_UNWRITABLE
        async with manager:

            def build(metrics: MetricsSink) -> Lifecycle:
                lifecycle = build_lifecycle(
                    s,
                    rt,
                    label=label,
                    min_rate=min_rate,
                    manager=manager,
                    state=keeper,
                    outbox=Outbox.for_keeper(manager, keeper),
                    shipper=shipper,
                    # The simulated machine's when the daemon is the simulator (as doctor sees).
                    sampler=assemble.memory_sampler(s, environ),
                    gpu=assemble.gpu_probe(s, environ),
                    metrics=metrics,
                )
                if on_phase is not None:
                    lifecycle.phase_listeners.append(on_phase)
                return lifecycle

            if not s.health_enabled:
                # No /metrics would read them: a stand-in that keeps nothing, so a run without
                # the health server never loads prometheus_client.
                return await build(NoMetrics()).run()
            # The health server and the metrics registry only when the server is on.
            from cuzk_supervisor.serve.health import HealthServer
            from cuzk_supervisor.serve.metrics import SupervisorMetrics
            from cuzk_supervisor.serve.probes import LifecycleSource, StartupLatch

            metrics = SupervisorMetrics()
            lifecycle = build(metrics)
            # /startupz passes once a phase after warmup is entered (the daemon answered).
            startup = StartupLatch()
            lifecycle.phase_listeners.append(startup.on_phase)
            # Started here, not in the lifecycle's task group, so a busy port is a plain
            # one-line error (exit 2) rather than an exception group.
            async with HealthServer(
                s.health_listen,
                LifecycleSource(lifecycle),
                metrics,
                allow_public=s.health_allow_public,
                startup=startup,
                # Read at scrape time: a len() on the loop, always current.
                refresh=lambda: metrics.outbox_depth(len(lifecycle.outbox.pending)),
            ):
                return await lifecycle.run()

    return observe.finish_view(
        run_supervised(body, cleanup_grace_s=s.daemon_stop_grace_s, keep_children=keep_children)
    )
