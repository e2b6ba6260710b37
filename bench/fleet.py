"""A fleet of N machines against one manager: what the fleet costs the manager, and how it
comes back after an outage or through a proxy's throttling (issue 22).

    .venv/bin/python bench/fleet.py [--machines 2000] [--outage-s 1800] [--time-scale 10]
                                    [--manager-url URL] [--scenario outage|throttle|all]
                                    [--throttle 0.5] [--throttle-s 600] [--retry-after 30]
                                    [--compare-machines N] [--json FILE] [--quick]

N virtual machines run in this one process on scaled time (``_clockpatch``: 1 real second is
``--time-scale`` simulated seconds), each with the supervisor's own manager-facing code
(``_fleet.VirtualMachine``: the manager client, the outbox, the log shipper, the reporter and
the monitors' loops, as the composition root wires them; only the daemon, the proofs, the
memory watch and the state file's disk are stand-ins). By default the simulated manager runs in
its own process (``python -m cuzk_supervisor.sim.manager``, a fresh one per fleet);
``--manager-url`` points the fleet at another manager instead (then the outage, the throttling
and the manager-side counts, which need the simulated manager's ``/sim/`` endpoints, are not
measured).

While the event loop lags (a burst costs more CPU than the process has), the virtual clock
slows down (``_clockpatch.govern``) and speeds up again when it keeps up: otherwise every
timeout of every machine would fire on answers that came in time, and the retries add to the
burst (a fleet of 2,000 on two cores then measures its own host, not the product). The rows
say how long it was slowed; ``--no-governor`` turns it off.

Scenario ``outage`` (the default): every machine starts in the same second and goes through
register, params, the bench phases (sleeps) and report into the run phase; after a warm-up,
the steady run phase is measured for ``--steady-s``; then the manager refuses connections for
``--outage-s`` (a late cohort, ``--late`` of the fleet, has its ``/bench-done`` due in the
outage), and the recovery is watched until the fleet's log backlog is back to its steady size.
A smaller fleet (``--compare-machines``, default N/10) runs the steady phase first, for the
per-machine bytes at two sizes.

Scenario ``throttle``: a proxy answers ``--throttle`` of the requests 429 ``Retry-After:
--retry-after`` for ``--throttle-s`` from the fleet's start; every machine should still reach
its verdict, with no report lost and no request made before the ``Retry-After`` it was given.

Prints a table, then the JSON rows (``{name, value, unit, target, ok}``, as every benchmark of
``bench/`` writes them; also to ``--json FILE``). ``--quick``: both scenarios, 20 machines,
phases of seconds of real time at time scale 100, the run phase's log flush interval 10 s (the
product's 120 s) so that a short warm-up passes its switch (every row measured, not figures for
the targets). Durations are simulated seconds unless named real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _clockpatch  # first of the non-stdlib imports: it scales the clocks they bind
import httpx
from _fleet import (
    CLOCK,
    Lifecycle,
    Recorder,
    Request,
    VirtualMachine,
    configure_logging,
    ssl_context,
)
from _harness import (
    MANAGER_READY_RE,
    PY,
    BenchError,
    Processes,
    Row,
    at_least,
    at_most,
    child_env,
    failed,
    finish,
    info,
    print_table,
    standard_options,
)

from cuzk_supervisor.settings import Settings

KB = 1000.0
REPORT_PATHS = ("/param-done", "/bench-done")
LOGGED_PATHS = ("/register", "/param-done", "/bench-done", "/running")  # a manager-log line each
SAMPLE_EVERY_S = 2.0  # the fleet's backlog and the loop's lag are sampled this often
FREEZE_EVERY_S = 30.0  # gc.freeze() this often (virtual s): full collections scan the rest only
QUICK_TIME_SCALE = 100.0  # --quick: sim seconds per real second
# --quick: the run phase's log flush interval (the product's 120 s), so that a short warm-up
# passes the run phase's flush switch: the steady phase, and the backlog the recovery drains
# back to, are the run phase's.
QUICK_LOG_PUSH_INTERVAL_S = 10.0


# --- the simulated manager ------------------------------------------------------------------------


class SimManager:
    """``python -m cuzk_supervisor.sim.manager`` on a free port, in its own process."""

    def __init__(self, procs: Processes, db: Path, time_scale: float) -> None:
        argv = [
            PY, "-m", "cuzk_supervisor.sim.manager", "--db", str(db),
            "--listen", "127.0.0.1:0", "--time-scale", f"{time_scale:g}",
        ]  # fmt: skip
        env = {k: v for k, v in child_env({}).items() if not k.startswith("CUZK_SIM_MANAGER_")}
        self.proc = procs.spawn(argv, env)
        self._lines: list[str] = []
        self._ready = threading.Event()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        if not self._ready.wait(30):  # real seconds (threading keeps real time)
            raise BenchError(f"sim manager not listening: {self._lines[-5:]}")
        match = next(m for m in map(MANAGER_READY_RE.search, self._lines) if m)
        self.url = match.group(1)

    @property
    def lines(self) -> list[str]:
        return list(self._lines)

    def _read(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._lines.append(line)
            if MANAGER_READY_RE.search(line):
                self._ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(Exception):
                self.proc.wait(10)


class Control:
    """The bench's own client of the manager (not a machine's: never recorded)."""

    def __init__(self, url: str) -> None:
        # Timeouts are virtual seconds: a minute of real time at any scale.
        self.http = httpx.AsyncClient(base_url=url, timeout=60.0 * CLOCK.scale)
        self.is_sim = False
        self.problems: list[str] = []

    async def probe(self) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await self.http.get("/sim/faults")
            self.is_sim = r.status_code == 200 and isinstance(r.json(), dict)

    async def counters(self, reports: bool = False) -> dict[str, Any] | None:
        """``GET /sim/counters`` (None: not the simulated manager); a refused connection (the
        outage just ending) is tried again a few times."""
        if not self.is_sim:
            return None
        last = ""
        for _ in range(20):
            try:
                r = await self.http.get("/sim/counters", params={"reports": 1} if reports else None)
                r.raise_for_status()
                return dict(r.json())
            except (httpx.HTTPError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(1.0)
        self.problems.append(f"GET /sim/counters: {last}")
        return None

    async def faults(self, **changes: Any) -> None:
        base, timeout = str(self.http.base_url), 60.0 * CLOCK.scale
        async with httpx.AsyncClient(base_url=base, timeout=timeout) as client:
            r = await client.post("/sim/faults", json=changes)  # refuse_for drops its connection
            r.raise_for_status()

    async def aclose(self) -> None:
        await self.http.aclose()


# --- one fleet's run ------------------------------------------------------------------------------


@dataclass
class Plan:
    machines: int
    late: int = 0
    warm_s: float = 120.0
    steady_s: float = 600.0
    outage_s: float = 0.0
    recovery_min_s: float = 120.0
    recovery_max_s: float = 1200.0
    throttle: float = 0.0
    throttle_s: float = 0.0
    throttle_tail_s: float = 60.0  # watched after the throttling ends
    retry_after: float = 30.0
    measure_steady: bool = True
    outage_scale: float = 0.0  # the time scale while the manager is away (0: unchanged)
    start_scale: float = 0.0  # the time scale until the fleet is in the run phase (0: unchanged)


@dataclass
class FleetRun:
    plan: Plan
    machines: list[VirtualMachine]
    recorder: Recorder
    marks: dict[str, float] = field(default_factory=dict)
    counters: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    backlog: list[tuple[float, int, int]] = field(default_factory=list)  # t, lines, reports
    lags: list[float] = field(default_factory=list)
    real_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of this process (the fleet) during the run
    sim_s: float = 0.0
    drained: bool = False
    problems: list[str] = field(default_factory=list)


def _settled(m: VirtualMachine) -> bool:
    """In the run phase, or ended another way (a verdict of fail, gone, an error)."""
    o = m.outcome
    return (
        o.running_at is not None or o.verdict is False or o.gone is not None or o.error is not None
    )


async def _sample(run: FleetRun, stop: asyncio.Event) -> None:
    """The fleet's backlog (log lines waiting, reports pending) and the loop's lag."""
    machines = run.machines
    frozen = CLOCK.monotonic()
    while not stop.is_set():
        asked = CLOCK.monotonic()
        await asyncio.sleep(SAMPLE_EVERY_S)
        if asked - frozen >= FREEZE_EVERY_S:  # what lived this long lives on: out of the scans
            gc.freeze()
            frozen = asked
        now = CLOCK.monotonic()
        run.lags.append(max(0.0, now - asked - SAMPLE_EVERY_S))
        lines = sum(m.shipper.stats().buffered_lines for m in machines)
        reports = sum(len(m.reporter.outbox.pending) for m in machines)
        run.backlog.append((now, lines, reports))


async def _until(predicate: Any, deadline: float, step: float = 1.0) -> bool:
    while not predicate():
        if CLOCK.monotonic() >= deadline:
            return False
        await asyncio.sleep(step)
    return True


async def run_fleet(
    plan: Plan, url: str, control: Control, life: Lifecycle, settings: Settings, seed: int
) -> FleetRun:
    recorder = Recorder()
    context = ssl_context()
    rng = random.Random(seed)
    n_main = plan.machines - plan.late
    machines = [
        VirtualMachine(
            i, "main" if i < n_main else "late", settings, life, recorder, context, seed + 7 * i
        )
        for i in range(plan.machines)
    ]
    run = FleetRun(plan, machines, recorder)
    gc.freeze()  # the fleet's long-lived objects: never scanned again (see _freeze)
    stop, sampling = asyncio.Event(), asyncio.Event()
    real0 = _clockpatch.real_monotonic()
    cpu0 = time.process_time()

    async def start(m: VirtualMachine, at: float) -> None:
        await asyncio.sleep(max(0.0, at - CLOCK.monotonic()))
        await m.run(stop)

    # A fleet started in the same second is a burst the manager answers in real time: a slower
    # scale until the fleet is running keeps its answers from looking scale-times slower.
    scale = CLOCK.asked
    if plan.start_scale > 0:
        CLOCK.set_scale(plan.start_scale)
    t0 = CLOCK.monotonic()
    run.marks["start"] = t0
    sampler = asyncio.ensure_future(_sample(run, sampling))
    throttle_off: asyncio.Future[None] | None = None
    if plan.throttle > 0 and control.is_sim:
        await control.faults(
            throttle_rate=plan.throttle, retry_after=plan.retry_after, retry_after_form="seconds"
        )
        run.marks["throttle_end"] = t0 + plan.throttle_s

        async def end_throttle() -> None:  # on the virtual clock (the governor may slow it)
            await asyncio.sleep(max(0.0, t0 + plan.throttle_s - CLOCK.monotonic()))
            await control.faults(throttle_rate=0.0)

        throttle_off = asyncio.ensure_future(end_throttle())
    main = [m for m in machines if m.cohort == "main"]
    late = [m for m in machines if m.cohort == "late"]
    tasks = [asyncio.ensure_future(start(m, t0 + rng.random())) for m in main]  # one second
    lifecycle_s = life.params_s + life.middle_s
    await _until(
        lambda: all(_settled(m) for m in main),
        t0 + lifecycle_s + plan.throttle_s + 3600,
    )
    run.marks["all_running"] = CLOCK.monotonic()
    gc.freeze()
    if not plan.throttle_s:
        CLOCK.set_scale(scale)
    if plan.throttle_s:
        await _until(lambda: False, t0 + plan.throttle_s + plan.throttle_tail_s)
        if throttle_off is not None:
            await throttle_off
        run.marks["throttle_over"] = CLOCK.monotonic()
    if plan.measure_steady:
        await asyncio.sleep(plan.warm_s)
        t_s0 = CLOCK.monotonic()
        run.marks["steady_start"] = t_s0
        gc.freeze()
        run.counters["steady_start"] = await control.counters()
        late_at = t_s0 + plan.steady_s - life.params_s - 0.4 * life.middle_s
        tasks += [asyncio.ensure_future(start(m, late_at + rng.random())) for m in late]
        await asyncio.sleep(max(0.0, t_s0 + plan.steady_s - CLOCK.monotonic()))
        run.marks["steady_end"] = CLOCK.monotonic()
        run.counters["steady_end"] = await control.counters()
    if plan.outage_s > 0 and control.is_sim:
        # Nothing but failed connects while the manager is away: that stretch may run faster
        # (virtual time stays continuous; every timer keeps its virtual due time).
        # The manager's outage is given in real seconds: the governor holds the scale as it is
        # until it ends.
        scale = CLOCK.asked
        CLOCK.held += 1
        CLOCK.set_factor(1.0)  # the outage is light: failed connects only
        if plan.outage_scale > 0:
            CLOCK.set_scale(plan.outage_scale)
        t_out = CLOCK.monotonic()
        gc.freeze()
        await control.faults(refuse_for=CLOCK.real_seconds(plan.outage_s))
        run.marks["outage_start"] = t_out
        t_rec = t_out + plan.outage_s
        await asyncio.sleep(max(0.0, t_rec - CLOCK.monotonic()))
        CLOCK.set_scale(scale)
        CLOCK.held -= 1
        run.marks["recovery"] = t_rec
        run.counters["recovery"] = await control.counters()
        steady = [b for b in run.backlog if run.marks["steady_start"] <= b[0] < t_out]
        limit = max((b[1] for b in steady), default=0)

        def drained() -> bool:
            if not run.backlog or run.backlog[-1][0] < t_rec:
                return False
            _, lines, reports = run.backlog[-1]
            return lines <= limit and reports == 0

        run.drained = await _until(drained, t_rec + plan.recovery_max_s)
        if run.drained:
            run.marks["drained"] = run.backlog[-1][0]
        await _until(lambda: False, t_rec + plan.recovery_min_s)
        run.marks["end"] = CLOCK.monotonic()
    sampling.set()
    stop.set()
    await asyncio.wait(tasks, timeout=60)
    for task in tasks:
        task.cancel()
    sampler.cancel()
    run.marks.setdefault("end", CLOCK.monotonic())
    run.counters["final"] = await control.counters(reports=True)
    run.real_s = _clockpatch.real_monotonic() - real0
    run.cpu_s = time.process_time() - cpu0
    run.sim_s = CLOCK.monotonic() - t0
    return run


# --- the figures --------------------------------------------------------------------------------


def _in(
    requests: Sequence[Request], t0: float, t1: float, cohort: str | None = None
) -> list[Request]:
    return [r for r in requests if t0 <= r.start < t1 and (cohort is None or r.cohort == cohort)]


def _buckets(
    requests: Sequence[Request], t0: float, t1: float, width: float
) -> list[list[Request]]:
    n = max(1, math.ceil((t1 - t0) / width))
    out: list[list[Request]] = [[] for _ in range(n)]
    for r in requests:
        k = int((r.start - t0) // width)
        if 0 <= k < n:
            out[k].append(r)
    return out


@dataclass
class Steady:
    machines: int
    minutes: float
    requests_per_min: float  # per machine
    bytes_per_min: float  # per machine, both ways
    busiest_1s: int
    mean_1s: float
    manager_lines_per_min: float | None  # the manager's own log, whole fleet
    by_path: dict[str, int]


def steady(run: FleetRun) -> Steady | None:
    if "steady_end" not in run.marks:
        return None
    t0, t1 = run.marks["steady_start"], run.marks["steady_end"]
    n = sum(1 for m in run.machines if m.cohort == "main")
    reqs = _in(run.recorder.requests, t0, t1, "main")
    minutes = (t1 - t0) / 60.0
    per_s = [len(b) for b in _buckets(reqs, t0, t1, 1.0)]
    lines: float | None = None
    c0, c1 = run.counters.get("steady_start"), run.counters.get("steady_end")
    if c0 is not None and c1 is not None:
        written = c1["manager_log"]["lines_written"] - c0["manager_log"]["lines_written"]
        lines = written / minutes
    else:  # another manager: the answered calls that write a line
        lines = sum(1 for r in reqs if r.path in LOGGED_PATHS and 200 <= r.status < 300) / minutes
    return Steady(
        machines=n,
        minutes=minutes,
        requests_per_min=len(reqs) / n / minutes,
        bytes_per_min=sum(r.bytes_in + r.bytes_out for r in reqs) / n / minutes,
        busiest_1s=max(per_s),
        mean_1s=sum(per_s) / len(per_s),
        manager_lines_per_min=lines,
        by_path=dict(Counter(r.path for r in reqs)),
    )


@dataclass
class Recovery:
    busiest_10s_requests_per_s: float
    busiest_10s_bytes_per_s: float
    steady_requests_per_s: float  # per machine steady rate times the whole fleet
    drain_s: float | None
    observed_s: float
    refused: int  # requests that got no answer during the outage


def recovery(run: FleetRun, st: Steady | None) -> Recovery | None:
    if "recovery" not in run.marks:
        return None
    t_rec, t_end = run.marks["recovery"], run.marks["end"]
    answered = [r for r in _in(run.recorder.requests, t_rec, t_end) if r.status > 0]
    windows = _buckets(answered, t_rec, t_end, 1.0)
    counts = [len(b) for b in windows]
    sizes = [sum(r.bytes_in + r.bytes_out for r in b) for b in windows]
    best_n = max((sum(counts[i : i + 10]) for i in range(max(1, len(counts) - 9))), default=0)
    best_b = max((sum(sizes[i : i + 10]) for i in range(max(1, len(sizes) - 9))), default=0)
    per_machine_s = (st.requests_per_min / 60.0) if st is not None else 0.0
    outage = _in(run.recorder.requests, run.marks["outage_start"], t_rec)
    return Recovery(
        busiest_10s_requests_per_s=best_n / 10.0,
        busiest_10s_bytes_per_s=best_b / 10.0,
        steady_requests_per_s=per_machine_s * len(run.machines),
        drain_s=(run.marks["drained"] - t_rec) if run.drained else None,
        observed_s=t_end - t_rec,
        refused=sum(1 for r in outage if r.status == 0),
    )


@dataclass
class Reports:
    expected: int  # /param-done and /bench-done reports the machines queued
    lost: int  # queued and never applied
    twice: int  # applied more than once
    source: str  # "manager" (the sim's counts) or "client" (2xx answers seen)
    by_path: dict[str, tuple[int, int]] = field(default_factory=dict)  # path: (lost, twice)


def reports(run: FleetRun) -> Reports:
    final = run.counters.get("final")
    applied: dict[tuple[str, str], int] = {}
    if final is not None:
        source = "manager"
        for path in REPORT_PATHS:
            for uuid, count in final["reports"].get(path, {}).items():
                applied[(path, uuid)] = count
    else:
        source = "client"
        by_machine = {m.index: m.reporter.uuid for m in run.machines}
        for r in run.recorder.requests:
            uuid = by_machine.get(r.machine)
            if r.path in REPORT_PATHS and 200 <= r.status < 300 and uuid:
                applied[(r.path, uuid)] = applied.get((r.path, uuid), 0) + 1
    expected = lost = twice = 0
    by_path = {path: [0, 0] for path in REPORT_PATHS}
    for m in run.machines:
        uuid = m.reporter.uuid
        if uuid is None:
            continue
        kinds = {rep.kind for rep in m.outcome.reports}
        for path in REPORT_PATHS:
            kind = path.strip("/").replace("-", "_")
            if kind not in kinds:
                continue
            expected += 1
            count = applied.get((path, uuid), 0)
            lost += count == 0
            twice += count > 1
            by_path[path][0] += count == 0
            by_path[path][1] += count > 1
    paths = {path: (v[0], v[1]) for path, v in by_path.items()}
    return Reports(expected, lost, twice, source, paths)


@dataclass
class Logs:
    produced: int  # lines handed to the machines' shippers
    shipped: int  # lines the shippers sent
    dropped_by_machines: int
    received: int | None  # lines the manager stored on arrival
    kept: int | None  # lines in its rings at the end
    dropped_by_manager: int | None


def logs(run: FleetRun) -> Logs:
    stats = [m.shipper.stats() for m in run.machines]
    shipped = sum(s.sent_lines for s in stats)
    dropped = sum(s.dropped_total for s in stats)
    produced = shipped + dropped + sum(s.buffered_lines + s.rejected_lines for s in stats)
    final = run.counters.get("final")
    if final is None:
        return Logs(produced, shipped, dropped, None, None, None)
    il = final["instance_logs"]
    return Logs(
        produced, shipped, dropped, il["lines_received"], il["lines_kept"], il["lines_dropped"]
    )


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# --- rows ---------------------------------------------------------------------------------------


def outage_rows(run: FleetRun, small: FleetRun | None) -> list[Row]:
    n = run.plan.machines
    rows: list[Row] = []
    st = steady(run)
    tag = f"N={n}"
    if st is None:
        reason = "no steady run phase reached"
        for name, unit, target in (
            ("steady run phase: requests/min per machine", "req/min", "<= 1.5"),
            ("steady run phase: KB/min per machine", "KB/min", "<= 4"),
            ("steady run phase: busiest 1 s / average (lock-step)", "x", "<= 3"),
        ):
            rows.append(failed(f"{name} ({tag})", unit, target, reason))
    else:
        rows += [
            at_most(f"steady run phase: requests/min per machine ({tag})", st.requests_per_min,
                    "req/min", 1.5),
            at_most(f"steady run phase: KB/min per machine ({tag})", st.bytes_per_min / KB,
                    "KB/min", 4.0),
            at_most(f"steady run phase: busiest 1 s / average, lock-step ({tag})",
                    st.busiest_1s / st.mean_1s if st.mean_1s else None, "x", 3.0),
            info(f"steady run phase: manager's own log, lines/min ({tag})",
                 st.manager_lines_per_min, "lines/min"),
        ]  # fmt: skip
        if st.manager_lines_per_min:
            rows.append(info(f"steady run phase: minutes its 5,000-line log holds ({tag})",
                             5000 / st.manager_lines_per_min, "min"))  # fmt: skip
    if small is not None:
        sm = steady(small)
        ratio = sm and st and sm.bytes_per_min and st.bytes_per_min / sm.bytes_per_min
        name = f"per-machine bytes N={n} / N={small.plan.machines} (steady run phase)"
        if ratio:
            rows.append(info(f"steady run phase: KB/min per machine (N={small.plan.machines})",
                             sm.bytes_per_min / KB if sm else None, "KB/min"))  # fmt: skip
            rows.append(at_most(name, ratio, "x", 1.2))
        else:
            rows.append(failed(name, "x", "<= 1.2", "a steady phase is missing"))
    rec = recovery(run, st)
    out = f"after a {run.plan.outage_s / 60:g}-min outage ({tag})"
    if rec is None:
        reason = "the outage needs the simulated manager (/sim/faults)"
        rows.append(failed(f"busiest 10 s / steady request rate, {out}", "x", "<= 3", reason))
        rows.append(failed(f"backlog drained, {out}", "s", "<= 600", reason))
    else:
        ratio = (
            rec.busiest_10s_requests_per_s / rec.steady_requests_per_s
            if rec.steady_requests_per_s
            else None
        )
        rows += [
            info(f"busiest 10 s: manager requests/s, {out}", rec.busiest_10s_requests_per_s,
                 "req/s"),
            info(f"busiest 10 s: manager KB/s, {out}", rec.busiest_10s_bytes_per_s / KB, "KB/s"),
            info(f"steady request rate of the whole fleet ({tag})", rec.steady_requests_per_s,
                 "req/s"),
            at_most(f"busiest 10 s / steady request rate, {out}", ratio, "x", 3.0),
        ]  # fmt: skip
        drain_name = f"backlog drained, {out}"
        if rec.drain_s is not None:
            rows.append(at_most(drain_name, rec.drain_s, "s", 600))
        else:
            rows.append(
                Row(f"{drain_name} (not within {rec.observed_s:.0f} s)", rec.observed_s, "s",
                    "<= 600", False)
            )  # fmt: skip
        rows.append(info(f"requests unanswered during the outage ({tag})", rec.refused, "req"))
    rows += report_rows(run, out)
    rows += log_rows(run, tag)
    return rows


def report_rows(run: FleetRun, where: str) -> list[Row]:
    rep = reports(run)
    src = "" if rep.source == "manager" else ", client-side"
    return [
        info(f"reports queued, {where}", rep.expected, "reports"),
        at_most(f"reports lost, {where}{src}", rep.lost, "reports", 0),
        at_most(f"reports applied twice, {where}{src}", rep.twice, "reports", 0),
    ]


def log_rows(run: FleetRun, tag: str) -> list[Row]:
    lg = logs(run)
    n = len(run.machines)
    rows = [
        info(f"log lines produced per machine, whole run ({tag})", lg.produced / n, "lines"),
        info(f"log lines shipped per machine ({tag})", lg.shipped / n, "lines"),
        info(f"log lines dropped by the machines' buffers, per machine ({tag})",
             lg.dropped_by_machines / n, "lines"),
    ]  # fmt: skip
    if lg.kept is not None and lg.received is not None and lg.dropped_by_manager is not None:
        rows += [
            info(f"log lines kept by the manager per machine ({tag})", lg.kept / n, "lines"),
            info(f"log lines shipped and then dropped by the manager's rings, per machine "
                 f"({tag})", lg.dropped_by_manager / n, "lines"),
        ]  # fmt: skip
    return rows


def throttle_rows(run: FleetRun) -> list[Row]:
    n = run.plan.machines
    where = (
        f"{run.plan.throttle:.0%} answered 429 Retry-After {run.plan.retry_after:g} s for "
        f"{run.plan.throttle_s / 60:g} min, N={n}"
    )
    verdicts = sum(1 for m in run.machines if m.outcome.verdict is not None)
    early = sum(1 for r in run.recorder.requests if r.early)
    throttled = sum(1 for r in run.recorder.requests if r.status == 429)
    rows = [
        at_least(f"machines that reached their verdict ({where})", verdicts, "machines", n),
        at_most(f"requests made before their Retry-After ({where})", early, "req", 0),
        info(f"answers 429 received ({where})", throttled, "req"),
    ]
    return rows + report_rows(run, where)


def health_rows(runs: Sequence[FleetRun]) -> list[Row]:
    """Whether the run kept up: the loop's lag (a saturated CPU bunches requests up)."""
    lags = [lag for run in runs for lag in run.lags]
    errors = sum(1 for run in runs for m in run.machines if m.outcome.error)
    latency = [r.end - r.start for run in runs for r in run.recorder.requests if r.status > 0]
    machine_hours = sum(len(run.machines) * run.sim_s / 3600 for run in runs)
    cpu = sum(run.cpu_s for run in runs)
    return [
        info("fleet process CPU per machine-hour simulated, s", cpu / machine_hours, "s"),
        info("manager answer time p99, sim s (real time x the scale)", percentile(latency, 0.99),
             "s"),
        at_most("event loop lag p99, sim s (figures distorted above)", percentile(lags, 0.99),
                "s", 2.0),
        info("event loop lag max, sim s", max(lags, default=0.0), "s"),
        info("machines ended by an unexpected error", errors, "machines"),
    ]  # fmt: skip


def describe(run: FleetRun, title: str) -> None:
    """A few readable lines about one fleet: phases reached, requests by path, errors."""
    print(
        f"\n== {title}: {run.plan.machines} machines, {run.sim_s:.0f} s simulated in "
        f"{run.real_s:.0f} s real, {run.cpu_s:.0f} s CPU =="
    )
    outcomes = Counter(
        "error" if m.outcome.error else
        "gone" if m.outcome.gone else
        "running" if m.outcome.running_at is not None else
        "failed verdict" if m.outcome.verdict is False else
        "not running"
        for m in run.machines
    )  # fmt: skip
    print("machines:", dict(outcomes))
    stuck = [m for m in run.machines if not _settled(m)]
    if stuck:
        phases = Counter(m.progress.phase for m in stuck)
        pending = Counter(r.kind for m in stuck for r in m.reporter.outbox.pending)
        print(f"  not in the run phase: by phase {dict(phases)}; reports pending {dict(pending)}")
    marks = {k: round(v - run.marks["start"]) for k, v in run.marks.items()}
    print("marks (sim s from start):", marks)
    st = steady(run)
    if st is not None:
        print(f"steady: {st.minutes:.1f} min; requests by path: {st.by_path}")
    if run.recorder.errors:
        print("transport errors:", run.recorder.errors)
    for problem in run.problems:
        print("problem:", problem)
    rep = reports(run)
    print(f"reports (lost, applied twice) by path ({rep.source}): {rep.by_path}")
    for m in [m for m in run.machines if m.outcome.error][:3]:
        print(f"  machine {m.index}: {m.outcome.error}")


# --- main ---------------------------------------------------------------------------------------


async def _one_fleet(
    plan: Plan,
    args: argparse.Namespace,
    procs: Processes,
    folder: Path,
    life: Lifecycle,
    scale: float,
    name: str,
) -> FleetRun:
    manager: SimManager | None = None
    CLOCK.set_scale(1.0)
    if args.manager_url:
        url = args.manager_url
    else:
        manager = SimManager(procs, folder / f"{name}.db", scale)
        url = manager.url
    CLOCK.set_scale(scale)
    control = Control(url)
    try:
        await control.probe()
        settings = Settings(manager_url=url)
        if args.quick:
            settings = Settings(manager_url=url, log_push_interval_s=QUICK_LOG_PUSH_INTERVAL_S)
        run = await run_fleet(plan, url, control, life, settings, args.seed)
        run.problems += control.problems
        if manager is not None and manager.proc.poll() is not None:
            tail = " | ".join(manager.lines[-5:])
            run.problems.append(f"the sim manager exited ({manager.proc.returncode}): {tail}")
        return run
    finally:
        await control.aclose()
        if manager is not None:
            manager.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manager-url", help="a manager to use (default: a simulated one per fleet)")
    p.add_argument("--machines", type=int, default=None, help="default 2000 (20 with --quick)")
    p.add_argument("--outage-s", type=float, default=1800.0)
    p.add_argument("--time-scale", type=float, default=5.0, help="sim seconds per real second")
    p.add_argument("--scenario", choices=("outage", "throttle", "all"), default=None,
                   help="default outage (all with --quick)")  # fmt: skip
    p.add_argument(
        "--compare-machines",
        type=int,
        default=None,
        help="a second, smaller fleet's steady phase (default N/10; 0: none)",
    )
    p.add_argument(
        "--start-time-scale",
        type=float,
        default=5.0,
        help="time scale from the start until the fleet runs (the throttle scenario: all of it)",
    )
    p.add_argument(
        "--outage-time-scale",
        type=float,
        default=0.0,
        help="time scale while the manager is away (default 3 x --time-scale)",
    )
    p.add_argument("--steady-s", type=float, default=600.0)
    p.add_argument("--warm-s", type=float, default=120.0, help="run phase before the steady one")
    p.add_argument(
        "--late",
        type=float,
        default=0.05,
        help="share of the fleet whose /bench-done is due in the outage",
    )
    p.add_argument("--throttle", type=float, default=0.5, help="share answered 429")
    p.add_argument("--throttle-s", type=float, default=600.0)
    p.add_argument("--retry-after", type=float, default=30.0)
    p.add_argument("--params-s", type=float, default=60.0)
    p.add_argument("--bench-s", type=float, default=120.0, help="plan to bench, together")
    p.add_argument("--daemon-lines-per-min", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--no-governor",
        action="store_true",
        help="keep the time scale asked for even while the process cannot keep up (by default "
        "the clock slows down while the event loop lags: see _clockpatch.govern)",
    )
    standard_options(
        p, f"20 machines, phases of seconds, both scenarios, time scale {QUICK_TIME_SCALE:g}"
    )
    return p


async def main_async(args: argparse.Namespace) -> tuple[list[Row], list[FleetRun]]:
    # The throttle's tail and the least and most recovery watched (0: the full run's).
    quick_tail_s = quick_recovery_max_s = 0.0
    if args.quick:
        # Every row measured, not figures for the targets: short phases at a faster clock.
        args.machines = args.machines or 20
        args.outage_s, args.steady_s, args.warm_s = 30.0, 60.0, 2 * QUICK_LOG_PUSH_INTERVAL_S
        args.throttle_s, args.retry_after = 30.0, 10.0
        args.params_s, args.bench_s = 5.0, 10.0
        args.time_scale = args.start_time_scale = QUICK_TIME_SCALE
        args.outage_time_scale = args.outage_time_scale or QUICK_TIME_SCALE
        args.scenario = args.scenario or "all"
        quick_tail_s, quick_recovery_max_s = 20.0, 300.0
    scenario = args.scenario or "outage"
    n = args.machines = args.machines or 2000
    life = Lifecycle(
        params_s=args.params_s,
        middle_s=args.bench_s,
        daemon_lines_per_min=args.daemon_lines_per_min,
    )
    compare = args.compare_machines if args.compare_machines is not None else max(1, n // 10)
    rows: list[Row] = []
    runs: list[FleetRun] = []
    folder = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    procs = Processes(str(folder))  # this run's own: a concurrent run's processes are not ours
    governed: dict[str, float] = {}
    governor = None if args.no_governor else asyncio.ensure_future(_clockpatch.govern(governed))
    try:
        if scenario in ("outage", "all"):
            small = None
            if compare > 0:
                faster = min(5.0, max(1.0, n / compare / 2))  # a smaller fleet runs faster
                scale = args.time_scale if args.quick else args.time_scale * faster
                start = args.start_time_scale if args.quick else args.start_time_scale * faster
                plan = Plan(compare, warm_s=args.warm_s, steady_s=args.steady_s, start_scale=start)
                small = await _one_fleet(plan, args, procs, folder, life, scale, "compare")
                describe(small, f"steady phase, N={compare}")
                runs.append(small)
            plan = Plan(
                n,
                late=max(1, round(n * args.late)) if args.late > 0 and args.outage_s > 0 else 0,
                warm_s=args.warm_s,
                steady_s=args.steady_s,
                outage_s=args.outage_s,
                recovery_min_s=quick_tail_s or min(600.0, max(60.0, args.outage_s / 3)),
                recovery_max_s=quick_recovery_max_s or Plan.recovery_max_s,
                outage_scale=args.outage_time_scale or 3 * args.time_scale,
                start_scale=args.start_time_scale,
            )
            big = await _one_fleet(plan, args, procs, folder, life, args.time_scale, "outage")
            describe(big, f"outage of {args.outage_s:g} s, N={n}")
            runs.append(big)
            rows += outage_rows(big, small)
        if scenario in ("throttle", "all"):
            plan = Plan(
                n,
                throttle=args.throttle,
                throttle_s=args.throttle_s,
                retry_after=args.retry_after,
                throttle_tail_s=quick_tail_s or 60.0,
                measure_steady=False,
                start_scale=args.start_time_scale,  # the whole scenario: it is one start
            )
            thr = await _one_fleet(plan, args, procs, folder, life, args.time_scale, "throttle")
            describe(thr, f"throttled {args.throttle:.0%} for {args.throttle_s:g} s, N={n}")
            runs.append(thr)
            if args.manager_url and not thr.counters.get("final"):
                rows.append(
                    failed(
                        "machines that reached their verdict (throttle)",
                        "machines",
                        f">= {n}",
                        "the throttling needs the simulated manager",
                    )
                )
            else:
                rows += throttle_rows(thr)
        rows += health_rows(runs)
        rows += [
            info("real time the clock ran slowed down (the process behind), s",
                 governed.get("slowed_real_s", 0.0), "s"),
            info("slowest clock, share of the scale asked for", governed.get("min_factor", 1.0),
                 "x"),
        ]  # fmt: skip
    finally:
        if governor is not None:
            governor.cancel()
        CLOCK.set_factor(1.0)
        CLOCK.set_scale(1.0)
        procs.close()
        shutil.rmtree(folder, ignore_errors=True)
    return rows, runs


GC_PAUSES: list[float] = []  # real seconds of each full (oldest generation) collection


def _gc_timer() -> Any:
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = _clockpatch.real_monotonic()
        else:
            GC_PAUSES.append(_clockpatch.real_monotonic() - started[0])

    return callback


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    # A full collection scans every object of 2,000 machines (a pause of a second or more,
    # which bunches every timer due in it into one instant of virtual time): the fleet's
    # long-lived objects are frozen at each phase (gc.freeze) and the pauses are a row.
    gc.callbacks.append(_gc_timer())
    started = _clockpatch.real_monotonic()
    loop = _clockpatch.scaled_loop()
    try:
        rows, _runs = loop.run_until_complete(main_async(args))
    finally:
        loop.close()
    elapsed = _clockpatch.real_monotonic() - started
    rows.append(info("longest full garbage collection, real s", max(GC_PAUSES, default=0.0), "s"))
    name = "wall time of the benchmark, real s"
    rows.append(info(name, elapsed, "s") if args.quick else at_most(name, elapsed, "s", 600))
    print()
    print_table(rows)
    data = [row.as_dict() for row in rows]
    print(json.dumps(data))
    return finish(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
