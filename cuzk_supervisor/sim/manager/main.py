"""``python -m cuzk_supervisor.sim.manager --db FILE``: the simulated fleet manager.

A real HTTP server in its own process, with SQLite state, serving the manager API of
``docs/manager-api.md`` as the real (Go) manager does, quirks and texts included, its monitor,
its platform side (``--vastai PROG``), switchable faults and, outside the real API, ``/sim/``
endpoints for tests and demos: docs/sim-manager.md, flag by flag.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.args import UsageError, build_parser, fault_settings, parse_listen
from cuzk_supervisor.sim.manager.faults import FaultError, Faults
from cuzk_supervisor.sim.manager.handler import ManagerRequestHandler
from cuzk_supervisor.sim.manager.listener import Listener, ManagerHTTPServer
from cuzk_supervisor.sim.manager.store import Store
from cuzk_supervisor.sim.manager.sweep import Timeouts, monitor_loop
from cuzk_supervisor.sim.manager.vast import VastCLI

EXIT_USAGE = 2
EXIT_START = 1


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        host, port, family = parse_listen(args.listen, args.allow_public)
        settings, refuse_for, throttle_for = fault_settings(args, dict(os.environ))
        if args.check_interval <= 0:
            raise UsageError("--check-interval must be > 0")
        if args.vastai and args.instances is not None:
            raise UsageError("--vastai and --instances exclude each other")
    except (UsageError, FaultError) as exc:
        sys.stderr.write(f"sim-manager: {exc}\n")
        return EXIT_USAGE

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        store = Store(args.db)
    except Exception as exc:  # sqlite3 errors, permissions
        sys.stderr.write(f"sim-manager: cannot open database {args.db}: {exc}\n")
        return EXIT_START
    timeouts = Timeouts.scaled(
        args.param_timeout,
        args.bench_timeout,
        args.check_interval,
        args.first_check,
        args.time_scale,
    )
    app = App(
        store,
        Faults(settings, throttle_for),
        timeouts,
        say,
        args.destroy_command,
        args.verbose,
        args.instances,
        VastCLI(args.vastai, args.deploy_image) if args.vastai else None,
    )
    server = ManagerHTTPServer((host, port), ManagerRequestHandler, app, family)
    listener = Listener(server, host, port, say)
    app.listener = listener
    try:
        listener.start(refuse_for)
    except OSError as exc:
        sys.stderr.write(f"sim-manager: cannot bind {args.listen}: {exc}\n")
        store.close()
        return EXIT_START
    app.log(f"API server listening on {listener.url.removeprefix('http://')}")
    monitor = threading.Thread(
        target=monitor_loop, args=(app.monitor, stop), name="monitor", daemon=True
    )
    monitor.start()
    while not stop.wait(1.0):
        pass
    listener.stop()
    monitor.join(timeout=5)
    store.close()
    say("sim-manager stopped")
    return 0
