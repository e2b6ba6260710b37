"""A fleet of N machines against one manager behind a TLS front, phase by phase, on virtual
time: what each phase costs the manager per machine, and whether a proxy's weather ends a
machine or loses a report (issues 22 and 31).

    .venv/bin/python bench/fleet.py [--machines 2000] [--weather-s 600] [--outage-s 1800]
                                    [--throttle-s 600] [--json FILE] [--quick]

N virtual machines run in this one process (``_fleet.VirtualMachine``: the supervisor's own
manager client, outbox, log shipper, reporter and monitors, as the composition root wires them;
only the children, the proofs, the memory watch and the state file's disk are stand-ins), all on
ONE injected clock: a virtual-time event loop (``cuzk_supervisor.sim.vtime``) whose clock jumps
to its next timer when every machine waits on timers only, and runs at the real rate while a
request is in flight, so a slow manager is as slow as it is, and no time module is patched.

The manager is the simulated one (``python -m cuzk_supervisor.sim.manager``), in front of it a
TLS-terminating proxy (``_tlsproxy``, its own process) that counts the bytes on the wire, TLS
handshakes included; the machines speak HTTPS to the proxy over their own persistent connection.

The timeline (virtual seconds):

1. the fleet is deployed over ``--deploy-s`` (machines start spread over it), registers and
   fetches its parameters (``--params-s``) with a chatty fetch (``--fetch-lines-per-s``; the
   ``--loud`` first machines at ``--loud-lines-per-s``, 1,000), then plans, warms up, settles
   and benches (``--bench-s``) with a chatty daemon (``--daemon-lines-per-s``), reports and
   runs: each duration drawn within +-20 % of its setting;
2. the run phase, once every machine is in it: ``--warm-s``, then a steady window of
   ``--steady-s``;
3. the **weather**: for ``--weather-s`` the proxy answers ``--weather-share`` of the requests
   with its own pages (``--weather-page``: nginx's HTML 404 and 403), while a late cohort
   (``--late`` of the fleet) registers, reports ``/param-done`` and ``/bench-done`` and starts
   running; then ``--recover-s`` with the manager's own answers;
4. the **outage** (``_fleetoutage``): for ``--outage-s`` the manager's host is gone (the TLS
   front refuses connections and cuts the open ones) while a cohort (``--late``) registered
   just before it has its reports due in it; then its recovery, watched for the drain;
5. the **429s**: for ``--throttle-s`` the manager answers ``--throttle`` of the requests 429
   ``Retry-After: --retry-after`` while another cohort registers and reports; then
   ``--recover-s``. A phase of 0 s is left out (its cohort too).

Figures (per machine, per phase): requests and KB a minute (HTTP bytes and bytes on the wire),
the busiest second against the phase's average, the longest wait of the dashboard before the
run phase, new connections a minute in the run phase; in the weather: instances ended, reports
lost or applied twice, requests against the steady rate; after the outage: its busiest 10 s
against the fleet's steady rate, the backlog's drain, reports lost or applied twice; under the
429s: verdicts reached, requests before their Retry-After, reports lost. Prints a table and the
JSON rows; the exit status is 1 when a figure could not be measured, 3 when a target is missed
(``--quick``: 20 machines and phases of minutes, every figure measured, the targets of what
must never happen held: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import _fleet
import _fleetoutage
from _fleet import Lifecycle, Recorder, VirtualMachine, configure_logging
from _fleetfigures import attribute_raw
from _fleetrows import Plan, Run, describe, health_rows, rows_of, steady_per_min
from _harness import (
    MANAGER_READY_RE,
    PY,
    BenchError,
    Processes,
    child_env,
    finish,
    held,
    info,
    print_table,
    standard_options,
    within,
)

from cuzk_supervisor.adapters.manager.http import HttpTransport
from cuzk_supervisor.adapters.manager.wire import HttpRequest, Timeouts
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim import vtime

REPO = Path(__file__).resolve().parent.parent
CERT = REPO / "tests" / "fixtures" / "localhost-tls.pem"
KB = 1000.0
CONTROL = Timeouts(10.0, 60.0, 60.0)


# --- the processes: the simulated manager and the TLS proxy ----------------------------------


class Child:
    """A process whose first matching output line gives its address."""

    def __init__(self, procs: Processes, argv: list[str], ready: str) -> None:
        env = {k: v for k, v in child_env({}).items() if not k.startswith("CUZK_SIM_MANAGER_")}
        self.proc = procs.spawn(argv, env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._pattern = ready
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        if not self._ready.wait(30):
            raise BenchError(f"{argv[1]} not ready: {self.lines[-5:]}")

    def _read(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if self._pattern in line:
                self._ready.set()

    def line(self) -> str:
        return next(line for line in self.lines if self._pattern in line)


class Control:
    """The bench's own requests (the manager's /sim/ endpoints, the proxy's stats), on the
    product's transport, counted as in flight so that time does not jump during them."""

    def __init__(self, manager_url: str, proxy_control: str) -> None:
        self.manager = HttpTransport(manager_url)
        self.proxy = proxy_control

    async def _send(self, transport: HttpTransport, request: HttpRequest) -> Any:
        _fleet.IN_FLIGHT[0] += 1
        try:
            answer = await transport.send(request, CONTROL)
        finally:
            _fleet.IN_FLIGHT[0] -= 1
        if answer.status != 200:
            raise BenchError(f"{request.target}: HTTP {answer.status}")
        return json.loads(answer.body)

    async def faults(self, **changes: Any) -> None:
        await self._send(self.manager, HttpRequest.of_json("POST", "/sim/faults", changes))

    async def counters(self) -> dict[str, Any]:
        return dict(await self._send(self.manager, HttpRequest("GET", "/sim/counters?reports=1")))

    async def _proxy(self, target: str) -> Any:
        transport = HttpTransport(self.proxy)
        try:
            return await self._send(transport, HttpRequest("GET", target))
        finally:
            await transport.aclose()

    async def proxy_stats(self) -> list[dict[str, Any]]:
        return list(await self._proxy("/stats"))

    async def outage(self, on: bool) -> None:
        await self._proxy(f"/outage/{'on' if on else 'off'}")

    async def aclose(self) -> None:
        await self.manager.aclose()


# --- the run ------------------------------------------------------------------------------------


def _running(m: VirtualMachine) -> bool:
    o = m.outcome
    return o.running_at is not None or o.verdict is False or o.gone is not None or bool(o.error)


async def run_fleet(plan: Plan, url: str, control: Control, clock: vtime.VirtualClock) -> Run:
    settings = Settings(manager_url=url)
    context = ssl.create_default_context(cafile=str(CERT))
    recorder = Recorder()
    n_main = plan.machines - plan.late * len(plan.cohorts)
    cohorts = ["main"] * n_main + [name for name in plan.cohorts for _ in range(plan.late)]
    machines = []
    for i, cohort in enumerate(cohorts):
        life = plan.life if cohort == "main" else plan.late_life
        if i < plan.loud:
            loud = plan.loud_lines_per_s
            life = replace(life, fetch_lines_per_s=loud, daemon_lines_per_s=loud)
        machines.append(VirtualMachine(i, cohort, settings, life, recorder, clock, context,
                                       7 * i + 1))  # fmt: skip
    run = Run(plan, machines, recorder, clock)
    gc.freeze()  # the fleet's long-lived objects: out of every full collection's scan
    stop = asyncio.Event()
    rng = random.Random(1)
    t0 = clock.monotonic()
    run.marks["start"] = t0

    async def start(m: VirtualMachine, at: float) -> None:
        await asyncio.sleep(max(0.0, at - clock.monotonic()))
        await m.run(stop)

    main = machines[:n_main]
    tasks = [asyncio.ensure_future(start(m, t0 + rng.uniform(0, plan.deploy_s))) for m in main]
    life = plan.life
    longest = plan.deploy_s + (life.params_s + life.middle_s) * (1 + life.spread) + 3600
    await _fleetoutage.until(clock, lambda: all(_running(m) for m in main), t0 + longest)
    run.marks["all_running"] = clock.monotonic()
    await asyncio.sleep(plan.warm_s)

    def mark(name: str) -> None:
        run.marks[name] = clock.monotonic()
        run.opened[name] = [m.http.opened for m in machines]

    def launch(cohort: str, at: float) -> None:
        tasks.extend(asyncio.ensure_future(start(m, at + rng.uniform(0, 30)))
                     for m in machines if m.cohort == cohort)  # fmt: skip

    mark("steady_start")
    sampling = asyncio.Event()
    sampler = asyncio.ensure_future(_fleetoutage.sample_backlog(run, sampling))
    await asyncio.sleep(plan.steady_s)
    mark("steady_end")
    if plan.weather_s > 0:
        late_at = run.marks["steady_end"] + 30.0
        launch("late", late_at)
        # Every late machine registered, none has fetched yet: its reports all fall in it.
        await asyncio.sleep(max(0.0, late_at + 35 - clock.monotonic()))
        await control.faults(proxy_rate=plan.weather_share, proxy_pages=list(plan.weather_pages))
        mark("weather_start")
        await asyncio.sleep(plan.weather_s)
        await control.faults(proxy_rate=0.0)
        mark("weather_end")
        await asyncio.sleep(plan.recover_s)
        mark("recovered")
    if plan.outage_s > 0:
        await _fleetoutage.outage(run, control, launch)
    if plan.throttle_s > 0:
        launched = clock.monotonic()
        launch("throttle", launched)
        await control.faults(throttle_rate=plan.throttle, retry_after=plan.retry_after,
                             retry_after_form="seconds")  # fmt: skip
        mark("throttle_start")
        await asyncio.sleep(plan.throttle_s)
        await control.faults(throttle_rate=0.0)
        mark("throttle_end")
        reporting = [m for m in machines if m.cohort == "throttle"]
        # Its whole life may outlast the 429s (--quick: 3 min of them, a life of 5): the
        # verdicts are awaited until the slowest life drawn, its 429s and recover_s are over.
        late = plan.late_life
        slowest = launched + 30 + (late.params_s + late.middle_s) * (1 + late.spread)
        until_s = max(clock.monotonic(), slowest + plan.throttle_s) + plan.recover_s
        await _fleetoutage.until(clock, lambda: all(_running(m) for m in reporting), until_s)
    sampling.set()
    await sampler
    stop.set()
    await asyncio.wait(tasks, timeout=120)
    for task in tasks:
        task.cancel()
    # Awaited once cancelled: none left to be closed with the loop (a shipper's last flush).
    await asyncio.gather(*tasks, return_exceptions=True)
    mark("end")
    run.counters = await control.counters()
    run.unmatched = attribute_raw(machines, recorder.requests, await control.proxy_stats())
    return run


# --- main ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machines", type=int, default=None, help="default 2000 (20 with --quick)")
    p.add_argument("--deploy-s", type=float, default=60.0)
    p.add_argument("--params-s", type=float, default=480.0)
    p.add_argument("--bench-s", type=float, default=720.0, help="plan to bench, together")
    p.add_argument("--fetch-lines-per-s", type=float, default=5.0)
    p.add_argument("--daemon-lines-per-s", type=float, default=5.0)
    p.add_argument("--loud", type=int, default=20, help="machines whose children are loud")
    p.add_argument("--loud-lines-per-s", type=float, default=1000.0)
    p.add_argument("--warm-s", type=float, default=240.0, help="run phase before the steady one")
    p.add_argument("--steady-s", type=float, default=900.0)
    p.add_argument("--weather-s", type=float, default=600.0)
    p.add_argument("--weather-share", type=float, default=0.5)
    p.add_argument(
        "--weather-page", action="append", dest="weather_pages",
        help="a proxy page (sim/manager/proxy.py); default html404 and html403",
    )  # fmt: skip
    p.add_argument("--late", type=float, default=0.05, help="share reporting in the weather")
    p.add_argument("--recover-s", type=float, default=300.0)
    p.add_argument(
        "--outage-s",
        type=within(0, 86_400),
        default=1800.0,
        help="the manager's outage, virtual s (0: none; default 1800)",
    )
    p.add_argument(
        "--throttle-s",
        type=within(0, 86_400),
        default=600.0,
        help="the 429 phase, virtual s (0: none; default 600)",
    )
    p.add_argument(
        "--throttle",
        type=within(0.01, 1),
        default=0.5,
        help="share of the requests answered 429 in it (default 0.5)",
    )
    p.add_argument(
        "--retry-after",
        type=within(1, 3600),
        default=30.0,
        help="the 429's Retry-After, s (default 30)",
    )
    standard_options(p, "20 machines, 2 loud, phases of minutes; the targets of what must "
                     "never happen held")  # fmt: skip
    return p


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        args.machines = args.machines or 20
        args.deploy_s, args.params_s, args.bench_s = 20.0, 120.0, 180.0
        args.loud = min(args.loud, 2)
        args.warm_s, args.steady_s, args.weather_s, args.recover_s = 150.0, 300.0, 300.0, 120.0
        args.outage_s, args.throttle_s = min(args.outage_s, 300.0), min(args.throttle_s, 180.0)
    n = args.machines = args.machines or 2000
    life = Lifecycle(params_s=args.params_s, middle_s=args.bench_s,
                     fetch_lines_per_s=args.fetch_lines_per_s,
                     daemon_lines_per_s=args.daemon_lines_per_s)  # fmt: skip
    late_life = replace(life, params_s=90.0, middle_s=180.0, spread=0.1)
    return Plan(
        machines=n, late=max(1, round(n * args.late)),
        loud=args.loud, deploy_s=args.deploy_s, warm_s=args.warm_s, steady_s=args.steady_s,
        weather_s=args.weather_s, weather_share=args.weather_share,
        weather_pages=tuple(args.weather_pages or ("html404", "html403")),
        recover_s=args.recover_s, life=life, loud_lines_per_s=args.loud_lines_per_s,
        late_life=late_life, outage_s=args.outage_s, throttle=args.throttle,
        throttle_s=args.throttle_s, retry_after=args.retry_after,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = plan_of(args)
    configure_logging()
    folder = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    procs = Processes(str(folder))
    started, cpu0 = time.monotonic(), time.process_time()
    try:
        manager = Child(procs, [PY, "-m", "cuzk_supervisor.sim.manager", "--db",
                                str(folder / "manager.db"), "--listen", "127.0.0.1:0"],
                        "sim-manager listening on")  # fmt: skip
        manager_url = MANAGER_READY_RE.search(manager.line()).group(1)  # type: ignore[union-attr]
        upstream = manager_url.removeprefix("http://")
        proxy = Child(procs, [PY, str(REPO / "bench" / "_tlsproxy.py"), "--upstream", upstream,
                              "--cert", str(CERT), str(folder)], "tlsproxy https://")  # fmt: skip
        _, url, _, control_url = proxy.line().split()
        clock = vtime.VirtualClock()
        control = Control(manager_url, control_url)

        async def go() -> Run:
            try:
                return await run_fleet(plan, url, control, clock)
            finally:
                await control.aclose()

        run = vtime.run(go(), clock, _fleet.busy)
        run.real_s, run.cpu_s = time.monotonic() - started, time.process_time() - cpu0
    finally:
        procs.close()
        shutil.rmtree(folder, ignore_errors=True)
    describe(run)
    rows = rows_of(run, args.quick)
    if "outage_watched" in run.marks:
        rows += _fleetoutage.outage_rows(run, steady_per_min(run))
    if "throttle_end" in run.marks:
        rows += _fleetoutage.throttle_rows(run)
    rows += health_rows(run)
    rows.append(info("wall time of the benchmark, real s", run.real_s, "s"))
    rows = held(rows, args.quick)
    print()
    print_table(rows)
    print(json.dumps([row.as_dict() for row in rows]))
    return finish(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
