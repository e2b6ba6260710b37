"""``python -m cuzk_supervisor.sim.manager --db FILE``: the simulated fleet manager.

A real HTTP server in its own process, with SQLite state, serving the manager API of
``docs/manager-api.md`` as the real (Go) manager does, quirks included: no
authentication; errors as JSON ``{"error": msg}`` with the real texts ("bad request: <Go's
decode error>", "label is required", "uuid query param required", "X-Instance-UUID header
required", "machine_id required"), but a plain-text ``method not allowed`` 405 (no ``Allow``
header; ``HEAD`` is a wrong method too) and Go's plain-text ``404 page not found``; JSON
written as Go's encoder writes it (``30``, not ``30.0``) and read as Go's decoder reads it
(``gojson``); ``/bench-done`` does not look at the current state; ``GET /status`` by
runner id, highest first, with whole-second ``YYYY-MM-DD HH:MM:SS`` UTC times; instance logs
kept in memory only (10,000 lines each, the oldest 1,000 dropped at once; ``ts`` in integer
milliseconds; the last 1,000 lines without ``tail``; ``source=all`` is every source; a ``\\r``
kept); the manager's own log (5,000 lines; a ``[running] uuid=…`` line per ``/running``); the
dashboard's ``POST /api/kill {"uuid", "vast_id"}`` ("manually killed via UI"); and the monitor:
a sweep first at +10 s, then every 60 s, killing timeouts ("param fetch timeout (90min)",
"benchmark timeout (45min)"), benches below min_rate ("bench_rate X below min_rate Y") and,
given the platform's instance list (``--instances FILE``), every live record that list does not
name ("instance disappeared from vast"). ``--time-scale`` divides the sweep's durations.

With ``--vastai PROG`` (a ``vastai`` CLI program) the real manager's platform side too:
``POST /api/deploy {"offer_id", "min_rate"}`` runs ``PROG create instance OFFER --image IMG
--disk 250 --env "-e PAVAIL=… -e PAVAIL_SERVER=… -e MIN_RATE=30.0" --ssh --direct
--onstart-cmd "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"`` (argv,
no shell; PAVAIL and PAVAIL_SERVER from the manager's own environment; ``--deploy-image``,
default ``magik6k/curio-cuzk:latest``) and answers ``{"ok": true, "instance_id": N}`` from
the ``new_contract`` it prints; the sweep reads ``PROG show instances --raw`` (not with
``--instances``); a destroyed container runs ``PROG destroy instance ID`` in the background.

Not part of the real API, for tests and demos, under ``/sim/`` (never faulted):

- ``POST /sim/kill`` ``{"uuid", "reason"}``: kill an instance with any reason (the real
  ``/api/kill`` always says "manually killed via UI").
- ``POST /sim/sweep``: run one sweep of the monitor now; answers the kills it made.
- ``GET /sim/requests?since=SEQ&path=P&sim=1``: every request received, in arrival order.
- ``GET /sim/manager-log?tail=N``: the manager's own log (as ``/api/manager-logs``, all of it
  without ``tail``).
- ``GET /sim/counters?reports=1``: requests, bytes in and out, answers by status, faulted,
  throttled and applied requests per endpoint (``counters``); lines written into the
  manager's own log and pushed instance log lines received, dropped and kept; with
  ``reports=1`` how many times each instance's reports were applied.
- ``GET /sim/faults``, ``POST /sim/faults`` ``{switch: value, ..., "refuse_for": s,
  "throttle_for": s}``.
- ``GET /sim/state``: instances, bad hosts, kills (with "destroyed"), the runner-id counter,
  the sweeps, the platform list last read, the timeouts in force.

Fault switches (``faults``): ``--fail-rate``, ``--fail-status``, ``--fail-next``,
``--html-rate``, ``--html-status``, ``--bad-body-rate``, ``--bad-body-kind``,
``--bad-body-applied``, ``--maintenance-next``, ``--maintenance-path``, ``--fault-path``,
``--latency``, ``--latency-phase``, ``--throttle-rate``, ``--throttle-status``,
``--retry-after``, ``--retry-after-form``, ``--throttle-for``, ``--proxy-rate``,
``--proxy-next``, ``--proxy-page`` (a proxy's own pages: HTML, plain or empty 404s,
401/403/405/413/429/502/503 pages, resets; ``proxy``), ``--seed``, ``--refuse-for``;
also the ``CUZK_SIM_MANAGER_FAULTS`` environment variable (flags win). A faulted request is answered
without being applied (but see ``--bad-body-applied``), and is recorded in ``/sim/requests``
with ``"faulted": true`` and its ``"fault"`` kind.

At fleet scale it behaves as the real one does: ``GET /status`` answers the whole table, killed
rows included, every time (its body is cached between writes: the bytes are the real one's, the
CPU is not); a proxy in front can be simulated that throttles a share of requests (429 or 503,
``Retry-After`` in seconds, as an HTTP-date, or none).

This module is the process (``main``); the rest, a job each: ``args`` (the command
line), ``app`` (what the handlers share; kills, destroys, deploys), ``handler``
(a request read, faulted, routed, answered, recorded), ``routes`` (the mux),
``api`` (the real API's handlers), ``simapi`` (``/sim/``), ``wire``
(requests and answers as Go writes them), ``sweep`` (the monitor), ``store``
(SQLite), ``instances`` (the records), ``platform`` (the platform's list),
``faults`` and ``proxy`` (the fault switches; a proxy's pages),
``listener`` (the socket, refusing), ``records`` (the logs, the journal),
``counters``, ``gojson`` (Go's JSON), ``vast`` (the ``vastai`` CLI).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.args import (
    UsageError,
    build_parser,
    fault_settings,
    parse_listen,
)
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
