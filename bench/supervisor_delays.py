"""The rate when the supervisor is late: a reset connection, a flooded log, a loaded machine.

    .venv/bin/python bench/supervisor_delays.py [--runs N] [--time-scale S] [--workers W]
                                                [--only NAME ...] [--quick] [--json FILE]

Each row runs the whole lifecycle (``supervisor run`` against the simulated manager and daemon,
real processes, scaled time; the warmup at the full workers, so no restart) with one of the
supervisor's own delays, and compares the rate the manager received with the quiet run's:

- ``quiet``: nothing beside the flow (the daemon writing no lines of its own);
- ``connection resets``: the daemon's listener (loopback TCP) resets every client connection
  after a seeded pause of 0.2 to 2 s, again and again (``--chaos-resets 0.2:2``);
- ``flood N lines/s``: a process beside the daemon writes N lines a second of ~125 bytes into
  the daemon's own stdout, which the supervisor reads, tags and logs (1,000, 10,000, 50,000);
- ``busy loops``: two busy loops per core beside the whole lifecycle, at our priority.

Each row gives three figures: the rate's error against the quiet run's (target: within 1 %,
issue 42), the supervisor's CPU above the quiet run's while the bench ran (% of one core), and
the daemon's idle time caused by us (the simulated daemon's own record, ``--timeline``: a
synthesis slot free with nothing waiting after the answer the next submission followed, over
the bench's proofs after the fill; % of the bench's span). The quiet row also gives its rate
against the model's steady rate of the plan (``sim.pipeline``, informational). The rate of a
row is the median of its runs' (``--runs``, default 2).

The table, then notes, go to stdout; ``--json FILE`` writes the rows as [{"name", "value",
"unit", "target", "ok"}]; progress goes to stderr. Exit 1 when a row could not be measured, 3
when one missed its target (``_harness.finish``). ``--quick``: one run per row at time scale
500, batches of 6 without the adaptive stop, the flood at 10,000 lines/s only, one busy loop per
core, the rows side by side: a check that every figure is still measured; its 1 % targets are a
full run's, shown and not judged (``_harness.held``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _settings as cfg
import psutil
from _harness import (
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    busy_loops,
    event_ts,
    failed,
    free_tcp_port,
    info,
    median,
    progress_printer,
    report,
    standard_options,
)

from cuzk_supervisor.sim.daemon.timeline import read_timeline

TARGET = 0.01
TIME_SCALE = 50.0
QUICK_TIME_SCALE = 500.0
WORKERS = 12  # the plan where a late submission costs most (C=2 does not fill its 12 slots)
RUNS = 2
QUICK_BENCH_COUNT = 6
BUSY_PER_CORE = 2
FLOODS = (1_000, 10_000, 50_000)
QUICK_FLOODS = (10_000,)
CPU_SAMPLE_S = 0.1

progress = progress_printer("delays")


@dataclass(frozen=True)
class Delay:
    name: str
    sim_args: tuple[str, ...] = ()
    busy_per_core: int = 0
    tcp: bool = False


def delays(quick: bool) -> list[Delay]:
    floods = QUICK_FLOODS if quick else FLOODS
    return [
        Delay("quiet"),
        Delay("connection resets every 0.2-2 s", ("--chaos-resets", "0.2:2"), tcp=True),
        *(Delay(f"flood {n:,} lines/s", ("--fault", f"flood:{n}")) for n in floods),
        Delay(
            f"busy loops, {1 if quick else BUSY_PER_CORE} per core",
            busy_per_core=1 if quick else BUSY_PER_CORE,
        ),
    ]


@dataclass(frozen=True)
class RunFigures:
    rate: float
    """Proofs per (simulated) hour, as the manager got it."""
    concurrency: int
    cpu_share: float
    """The supervisor's CPU seconds per second while the bench ran."""
    idle_share: float
    """The daemon's idle for want of our submissions over the bench's span (its own record)."""


class CpuWatch:
    """The supervisor's CPU time, sampled every ``CPU_SAMPLE_S`` until it exits."""

    def __init__(self, pid: int) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc = psutil.Process(pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                times = self._proc.cpu_times()
            except psutil.Error:
                return
            self.samples.append((time.time(), times.user + times.system))
            time.sleep(CPU_SAMPLE_S)  # a sampling cadence, not a synchronisation

    def share(self, start: float, end: float) -> float:
        inside = [(t, cpu) for t, cpu in self.samples if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            raise BenchError("too few CPU samples in the bench")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def bench_idle_share(timeline: Path, bench_ids: set[str]) -> float:
    """The daemon's idle for want of a submission over the bench's span, from its record: the
    ``starved_s`` of each bench job that followed a bench job's answer (the fill follows the
    settle proof's, which is no bench interval)."""
    jobs = [j for j in read_timeline(timeline) if j.times.job_id in bench_ids]
    if not jobs:
        raise BenchError("no bench job in the daemon's timeline")
    seqs = {j.times.seq for j in jobs}
    starved = sum(j.times.starved_s for j in jobs if j.times.reply_to in seqs)
    ends = [j.times.completed_s for j in jobs if j.times.completed_s is not None]
    span = max(ends) - min(j.times.arrived_s for j in jobs)
    return starved / span if span > 0 else 0.0


def one_run(
    procs: Processes, root: Path, d: Delay, scale: float, opts: argparse.Namespace, seed: int
) -> RunFigures:
    root.mkdir(parents=True, exist_ok=True)
    manager = Manager(procs, root / "manager.db")
    try:
        quick, workers = opts.quick, opts.workers
        memory_scale = cfg.QUICK_MEMORY_SCALE if quick else 1.0
        env = cfg.lifecycle(root, manager.url, scale, memory_scale)
        env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
        env["CUZK_SUPERVISOR_WORKERS"] = env["CUZK_SUPERVISOR_WARMUP_WORKERS"] = str(workers)
        env["CUZK_SUPERVISOR_BENCH_BUDGET_S"] = str(2 * 2700 / scale)
        if opts.queue_ahead is not None:
            env["CUZK_SUPERVISOR_BENCH_QUEUE_AHEAD"] = str(opts.queue_ahead)
        if quick:
            env["CUZK_SUPERVISOR_BENCH_COUNT"] = str(QUICK_BENCH_COUNT)
            env["CUZK_SUPERVISOR_BENCH_PRECISION"] = "0"
        timeline = root / "timeline.jsonl"
        args = [cfg.sim_args(scale, memory_scale=memory_scale), *d.sim_args]
        args += ["--timeline", str(timeline), "--chaos-seed", str(seed)]
        env["CUZK_SUPERVISOR_DAEMON_ARGS"] = " ".join(args)
        if d.tcp:
            env["CUZK_SUPERVISOR_DAEMON_LISTEN"] = f"127.0.0.1:{free_tcp_port()}"
        count = d.busy_per_core * (os.cpu_count() or 1)
        loops = busy_loops(procs, count)
        try:
            sup = SupervisorProc(procs, "run", env)
            cpu = CpuWatch(sup.pid)
            sup.waiter.join(600)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait(10)
        sup.dump(root / "events.jsonl")
        if sup.proc.returncode != 0:
            raise BenchError(f"exit {sup.proc.returncode}")
        results, started, done = (
            sup.named(n) for n in ("bench.result", "bench.started", "bench.stretch_done")
        )
        if not (results and started and done):
            raise BenchError("no bench.result")
        bench_ids = {
            str(e["job_id"])
            for e in sup.events
            if e.get("phase") == "bench" and str(e.get("event", "")).startswith("proof.")
            and e.get("job_id")
        }  # fmt: skip
        figures = RunFigures(
            rate=float(results[-1]["rate"]),
            concurrency=int(results[-1]["measurement"]["concurrency"]),
            cpu_share=cpu.share(event_ts(started[-1]), event_ts(done[-1])),
            idle_share=bench_idle_share(timeline, bench_ids),
        )
        progress(
            f"  {d.name}: {figures.rate:.2f} proofs/h, CPU {figures.cpu_share:.1%} of a core, "
            f"daemon idle for us {figures.idle_share:.2%}"
        )
        return figures
    finally:
        manager.stop()


def measure(
    procs: Processes, work: Path, index: int, d: Delay, runs: int, scale: float,
    opts: argparse.Namespace,
) -> tuple[list[RunFigures], list[str]]:  # fmt: skip
    got: list[RunFigures] = []
    notes: list[str] = []
    for n in range(runs):
        progress(f"{d.name}: run {n + 1}/{runs}")
        try:
            got.append(one_run(procs, work / f"d{index}r{n}", d, scale, opts, seed=n))
        except BenchError as exc:
            notes.append(f"{d.name}, run {n + 1}: {exc}")
    return got, notes


def rows_of(
    measured: list[tuple[Delay, list[RunFigures]]], workers: int
) -> tuple[list[Row], list[str]]:
    (_, quiet), *others = measured
    if not quiet:
        why = "the quiet run could not be measured"
        return [failed(f"{d.name}: rate error against quiet", "%", "|x| <= 1", why)
                for d, _ in measured], []  # fmt: skip
    base_rate = median([f.rate for f in quiet])
    base_cpu = median([f.cpu_share for f in quiet])
    model = cfg.steady_rate(workers, quiet[0].concurrency)
    rows = [
        info(f"quiet: rate ({len(quiet)} run(s))", round(base_rate, 2), "proofs/h"),
        info("quiet: rate against the model's steady rate", round((base_rate / model - 1) * 100, 2),
             "%"),
        info("quiet: supervisor CPU in the bench", round(base_cpu * 100, 2), "% core"),
        info("quiet: daemon idle caused by us",
             round(median([f.idle_share for f in quiet]) * 100, 3), "% bench"),
    ]  # fmt: skip
    notes = [f"quiet: rates {[round(f.rate, 2) for f in quiet]} proofs/h; model {model:.2f}"]
    for d, runs in others:
        name = f"{d.name}: rate error against quiet"
        if not runs:
            rows.append(failed(name, "%", "|x| <= 1", "no run measured"))
            continue
        error = median([f.rate for f in runs]) / base_rate - 1
        rows += [
            Row(name, round(error * 100, 2), "%", "|x| <= 1", abs(error) <= TARGET),
            info(f"{d.name}: supervisor CPU above quiet",
                 round((median([f.cpu_share for f in runs]) - base_cpu) * 100, 2), "% core"),
            info(f"{d.name}: daemon idle caused by us",
                 round(median([f.idle_share for f in runs]) * 100, 3), "% bench"),
        ]  # fmt: skip
        notes.append(f"{d.name}: rates {[round(f.rate, 2) for f in runs]} proofs/h")
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help=f"runs per row (default {RUNS})")
    parser.add_argument("--time-scale", type=float, default=None,
                        help=f"default {TIME_SCALE:g}; {QUICK_TIME_SCALE:g} quick")  # fmt: skip
    parser.add_argument("--workers", type=int, default=WORKERS, help="the plan's workers")
    parser.add_argument(
        "--queue-ahead", type=int, default=None,
        help="bench_queue_ahead (default: the product's; 0 shows the bench without it)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains this")
    standard_options(
        parser,
        f"1 run a row at time scale {QUICK_TIME_SCALE:g}, batches of {QUICK_BENCH_COUNT}, one "
        "flood, one busy loop a core, the rows side by side",
    )
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else RUNS)
    scale = args.time_scale or (QUICK_TIME_SCALE if args.quick else TIME_SCALE)
    chosen = [
        (i, d)
        for i, d in enumerate(delays(args.quick))
        if i == 0 or not args.only or any(o in d.name for o in args.only)
    ]
    work = Path(tempfile.mkdtemp(prefix="delays-bench-"))
    procs = Processes(str(work))
    try:
        with ThreadPoolExecutor(max_workers=len(chosen) if args.quick else 1) as pool:
            measured = list(
                pool.map(
                    lambda item: measure(procs, work, item[0], item[1], runs, scale, args),
                    chosen,
                )
            )
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    rows, notes = rows_of([(d, got) for (_, d), (got, _) in zip(chosen, measured, strict=True)],
                          args.workers)  # fmt: skip
    notes = [
        f"time scale {scale:g}, {args.workers} workers, {runs} run(s) a row, queue ahead "
        f"{'the default' if args.queue_ahead is None else args.queue_ahead}; the rate: the "
        "median of a row's runs",
        *notes,
        *(note for _, own in measured for note in own),
    ]
    return report(rows, notes, args.json, args.quick)


if __name__ == "__main__":
    sys.exit(main())
