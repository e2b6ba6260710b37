"""A fleet of N machines against one manager behind a TLS front, phase by phase, on virtual
time: what each phase costs the manager per machine, and whether a proxy's weather ends a
machine or loses a report (issues 22 and 31).

    .venv/bin/python bench/fleet.py [--machines 2000] [--weather-s 600] [--json FILE] [--quick]

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
   running; then ``--recover-s`` with the manager's own answers.

Figures (per machine, per phase): requests and KB a minute (HTTP bytes and bytes on the wire),
the busiest second against the phase's average, the longest wait of the dashboard before the
run phase, new connections a minute in the run phase; in the weather: instances ended, reports
lost or applied twice, requests against the steady rate. Prints a table and the JSON rows; the
exit status is 1 when a figure could not be measured, 2 when a target is missed (``--quick``:
every figure measured, targets shown, not enforced: 20 machines and phases of minutes).
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import _fleet
from _fleet import Lifecycle, Recorder, VirtualMachine, configure_logging
from _fleetfigures import GROUPS, attribute_raw, phase_cost, progress_gap_s
from _harness import (
    MANAGER_READY_RE,
    PY,
    BenchError,
    Processes,
    Row,
    at_most,
    child_env,
    finish,
    info,
    print_table,
    standard_options,
)

from cuzk_supervisor.adapters.manager.http import HttpTransport
from cuzk_supervisor.adapters.manager.wire import HttpRequest, Timeouts
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim import vtime

REPO = Path(__file__).resolve().parent.parent
CERT = REPO / "tests" / "fixtures" / "localhost-tls.pem"
KB = 1000.0
REPORT_PATHS = ("/param-done", "/bench-done")
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

    async def proxy_stats(self) -> list[dict[str, Any]]:
        transport = HttpTransport(self.proxy)
        try:
            return list(await self._send(transport, HttpRequest("GET", "/stats")))
        finally:
            await transport.aclose()

    async def aclose(self) -> None:
        await self.manager.aclose()


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Plan:
    machines: int
    late: int
    loud: int
    deploy_s: float
    warm_s: float
    steady_s: float
    weather_s: float
    weather_share: float
    weather_pages: tuple[str, ...]
    recover_s: float
    life: Lifecycle
    loud_lines_per_s: float
    late_life: Lifecycle


@dataclass
class Run:
    plan: Plan
    machines: list[VirtualMachine]
    recorder: Recorder
    clock: vtime.VirtualClock
    marks: dict[str, float] = field(default_factory=dict)
    opened: dict[str, list[int]] = field(default_factory=dict)  # connections opened, by mark
    counters: dict[str, Any] = field(default_factory=dict)
    unmatched: int = 0
    real_s: float = 0.0
    cpu_s: float = 0.0


async def _until(clock: vtime.VirtualClock, predicate: Any, deadline: float) -> bool:
    while not predicate():
        if clock.monotonic() >= deadline:
            return False
        await asyncio.sleep(5.0)
    return True


def _running(m: VirtualMachine) -> bool:
    o = m.outcome
    return o.running_at is not None or o.verdict is False or o.gone is not None or bool(o.error)


async def run_fleet(plan: Plan, url: str, control: Control, clock: vtime.VirtualClock) -> Run:
    settings = Settings(manager_url=url)
    context = ssl.create_default_context(cafile=str(CERT))
    recorder = Recorder()
    n_main = plan.machines - plan.late
    machines = []
    for i in range(plan.machines):
        late = i >= n_main
        life = plan.late_life if late else plan.life
        if i < plan.loud:
            loud = plan.loud_lines_per_s
            life = replace(life, fetch_lines_per_s=loud, daemon_lines_per_s=loud)
        machines.append(VirtualMachine(i, "late" if late else "main", settings, life, recorder,
                                       clock, context, 7 * i + 1))  # fmt: skip
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
    await _until(clock, lambda: all(_running(m) for m in main), t0 + longest)
    run.marks["all_running"] = clock.monotonic()
    await asyncio.sleep(plan.warm_s)

    def mark(name: str) -> None:
        run.marks[name] = clock.monotonic()
        run.opened[name] = [m.http.opened for m in machines]

    mark("steady_start")
    await asyncio.sleep(plan.steady_s)
    mark("steady_end")
    if plan.weather_s > 0:
        late_at = run.marks["steady_end"] + 30.0
        tasks += [asyncio.ensure_future(start(m, late_at + rng.uniform(0, 30)))
                  for m in machines[n_main:]]  # fmt: skip
        # Every late machine registered, none has fetched yet: its reports all fall in it.
        await asyncio.sleep(max(0.0, late_at + 35 - clock.monotonic()))
        await control.faults(proxy_rate=plan.weather_share, proxy_pages=list(plan.weather_pages))
        mark("weather_start")
        await asyncio.sleep(plan.weather_s)
        await control.faults(proxy_rate=0.0)
        mark("weather_end")
        await asyncio.sleep(plan.recover_s)
        mark("recovered")
    stop.set()
    await asyncio.wait(tasks, timeout=120)
    for task in tasks:
        task.cancel()
    mark("end")
    run.counters = await control.counters()
    run.unmatched = attribute_raw(machines, recorder.requests, await control.proxy_stats())
    return run


# --- the figures --------------------------------------------------------------------------------


def rows_of(run: Run, quick: bool) -> list[Row]:
    plan, machines, requests = run.plan, run.machines, run.recorder.requests
    main = [m for m in machines if m.cohort == "main"]
    end = run.marks["end"]
    rows: list[Row] = []
    tag = f"N={plan.machines}"
    targets = {"params": (6.0, 20.0), "bench": (6.0, 20.0), "run": (1.5, 4.0)}
    costs = {}
    for group, phases in GROUPS.items():
        window = None
        if group == "run":
            window = (run.marks["steady_start"], run.marks["steady_end"])
        cost = costs[group] = phase_cost(group, main, requests, phases, end, window)
        req_t, kb_t = targets[group]
        rows += [
            at_most(f"{group}: requests/min per machine ({tag})", cost.per_min, "req/min", req_t),
            at_most(f"{group}: KB/min per machine, on the wire with TLS ({tag})",
                    cost.raw_kb_per_min, "KB/min", kb_t),
            info(f"{group}: KB/min per machine, HTTP bytes ({tag})", cost.plain_kb_per_min,
                 "KB/min"),
            at_most(f"{group}: busiest 1 s / the phase's average, over "
                    f"{cost.stretch_s:.0f} s ({tag})", cost.busiest_1s, "x", 3.0),
        ]  # fmt: skip
    rows.append(at_most(f"dashboard: longest wait between two log pushes before the run phase "
                        f"({tag})", progress_gap_s(main, requests), "s", 30.0))  # fmt: skip
    minutes = (run.marks["steady_end"] - run.marks["steady_start"]) / 60
    opened = sum(b - a for a, b, m in zip(run.opened["steady_start"], run.opened["steady_end"],
                                           machines, strict=True) if m.cohort == "main")  # fmt: skip
    rows.append(at_most(f"run: new connections/min per machine ({tag})",
                        opened / len(main) / minutes, "conn/min", 0.2))  # fmt: skip
    loud = [m for m in main if m.index < plan.loud]
    if loud:
        for group in ("params", "bench"):
            cost = phase_cost(group, loud, requests, GROUPS[group], end)
            rows += [
                at_most(f"{group}, children at {plan.loud_lines_per_s:g} lines/s: requests/min "
                        f"per machine ({len(loud)} machines)", cost.per_min, "req/min", 6.0),
                at_most(f"{group}, children at {plan.loud_lines_per_s:g} lines/s: KB/min per "
                        f"machine with TLS ({len(loud)} machines)", cost.raw_kb_per_min,
                        "KB/min", 20.0),
            ]  # fmt: skip
    if "weather_start" in run.marks:
        rows += weather_rows(run, costs["run"].per_min)
    rows += health_rows(run)
    return rows


def weather_rows(run: Run, steady_per_min: float) -> list[Row]:
    plan, machines, requests = run.plan, run.machines, run.recorder.requests
    w0, w1 = run.marks["weather_start"], run.marks["weather_end"]
    where = (f"{plan.weather_share:.0%} of the requests answered {'/'.join(plan.weather_pages)} "
             f"for {plan.weather_s / 60:g} min, N={plan.machines}")  # fmt: skip
    ended = sum(1 for m in machines if m.outcome.gone is not None)
    applied: dict[tuple[str, str], int] = {}
    for path in (*REPORT_PATHS, "/running"):
        for uuid, count in run.counters.get("reports", {}).get(path, {}).items():
            applied[(path, uuid)] = count
    expected = lost = twice = 0
    for m in machines:
        uuid = m.reporter.uuid
        if uuid is None:
            lost += 1
            continue
        paths = [*REPORT_PATHS, *(("/running",) if m.cohort == "late" else ())]
        for path in paths:
            expected += 1
            count = applied.get((path, uuid), 0)
            lost += count == 0
            twice += count > 1 and path in REPORT_PATHS
    during = [r for r in requests if w0 <= r.start < w1]
    active = sum(1 for m in machines if m.cohort == "main" or m.outcome.registered_at)
    rate = len(during) / active / ((w1 - w0) / 60)
    told = sum(1 for m in machines if "manager.weather" in m.said)
    return [
        at_most(f"weather: instances ended ({where})", ended, "machines", 0),
        at_most(f"weather: reports lost ({where})", lost, "reports", 0),
        at_most(f"weather: reports applied twice ({where})", twice, "reports", 0),
        info(f"weather: reports of the late cohort and the fleet checked ({where})", expected,
             "reports"),
        at_most(f"weather: requests/min per machine over the steady rate ({where})",
                rate / steady_per_min if steady_per_min else None, "x", 2.0),
        info(f"weather: answers that were a proxy's page ({where})",
             sum(1 for r in during if r.status in (403, 404)), "req"),
        info(f"weather: machines that said manager.weather (a sustained episode) ({where})",
             told, "machines"),
    ]  # fmt: skip


def health_rows(run: Run) -> list[Row]:
    requests = run.recorder.requests
    latency = sorted(r.end - r.start for r in requests if r.status > 0)
    p99 = latency[int(0.99 * (len(latency) - 1))] if latency else None
    errors = sum(1 for m in run.machines if m.outcome.error)
    hours = len(run.machines) * (run.marks["end"] - run.marks["start"]) / 3600
    return [
        info("manager answer time p99 (the proxy and the manager in real time), s", p99, "s"),
        at_most("machines ended by an unexpected error", errors, "machines", 0),
        info("requests without their bytes on the wire matched (connections)", run.unmatched,
             "conn"),
        info("fleet process CPU per machine-hour simulated, s", run.cpu_s / hours, "s"),
        info("virtual time simulated, s", run.marks["end"] - run.marks["start"], "s"),
        info("virtual time that passed at the real rate (requests in flight), s",
             run.clock.real_waits_s, "s"),
    ]  # fmt: skip


def describe(run: Run) -> None:
    print(f"\n== {run.plan.machines} machines, {run.marks['end'] - run.marks['start']:.0f} s "
          f"simulated in {run.real_s:.0f} s real, {run.cpu_s:.0f} s CPU ==")  # fmt: skip
    outcomes = [("error" if m.outcome.error else "gone" if m.outcome.gone else
                 "running" if m.outcome.running_at else "not running") for m in run.machines]
    print("machines:", {k: outcomes.count(k) for k in sorted(set(outcomes))})
    print("marks (s from start):", {k: round(v - run.marks["start"]) for k, v in
                                    run.marks.items()})  # fmt: skip
    if run.recorder.errors:
        print("transport errors:", run.recorder.errors)
    for m in [m for m in run.machines if m.outcome.error or m.outcome.gone][:3]:
        print(f"  machine {m.index}: {m.outcome.error or m.outcome.gone}")


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
    p.add_argument("--weather-page", action="append", dest="weather_pages",
                   help="a proxy page (manager_proxy: html404, html403 ...); default both")  # fmt: skip
    p.add_argument("--late", type=float, default=0.05, help="share reporting in the weather")
    p.add_argument("--recover-s", type=float, default=300.0)
    standard_options(p, "20 machines, 2 loud, phases of minutes; targets shown, not enforced")
    return p


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        args.machines = args.machines or 20
        args.deploy_s, args.params_s, args.bench_s = 20.0, 120.0, 180.0
        args.loud = min(args.loud, 2)
        args.warm_s, args.steady_s, args.weather_s, args.recover_s = 150.0, 300.0, 300.0, 120.0
    n = args.machines = args.machines or 2000
    life = Lifecycle(params_s=args.params_s, middle_s=args.bench_s,
                     fetch_lines_per_s=args.fetch_lines_per_s,
                     daemon_lines_per_s=args.daemon_lines_per_s)  # fmt: skip
    late_life = replace(life, params_s=90.0, middle_s=180.0, spread=0.1)
    return Plan(
        machines=n, late=max(1, round(n * args.late)) if args.weather_s > 0 else 0,
        loud=args.loud, deploy_s=args.deploy_s, warm_s=args.warm_s, steady_s=args.steady_s,
        weather_s=args.weather_s, weather_share=args.weather_share,
        weather_pages=tuple(args.weather_pages or ("html404", "html403")),
        recover_s=args.recover_s, life=life, loud_lines_per_s=args.loud_lines_per_s,
        late_life=late_life,
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
    rows.append(info("wall time of the benchmark, real s", run.real_s, "s"))
    print()
    print_table(rows)
    print(json.dumps([row.as_dict() for row in rows]))
    code = finish(rows, args.json)
    if code == 0 and not args.quick and any(row.ok is False for row in rows):
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
