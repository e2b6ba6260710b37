"""The reported rate under ordinary disturbances, against the simulator's steady rate.

    .venv/bin/python bench/rate_disturbance.py [--runs N] [--time-scale S] [--json FILE]
                                               [--only NAME ...] [--quick]

Each row runs the whole lifecycle (``supervisor run`` against the simulated manager and daemon,
real processes, scaled time) with one disturbance, and compares the rate the manager received
with the model's steady rate of the plan the run ended on (``sim.daemon.pipeline``: completions 100
to 500 of a long closed loop at the bench's concurrency), or, where the machine slows down during
the bench, with the rate it holds at the end. Target: |error| <= 1 % in every row (issue 25: with
the adaptive stop on). Three rows are the field's rough edges (issue 32), each the worst of at
least ``FIELD_RUNS`` (10) runs: every core busy (``BUSY_PER_CORE`` busy loops a core beside the
whole lifecycle, at the supervisor's priority), connection chaos (the daemon's listener, on TCP,
resets every client connection after a seeded pause of 0.2 to 2 s, ``--chaos-resets``; a
different seed each run) and a throttle starting after the floor (5 workers, synthesis 10 %
slower from the daemon's 7th completion, the settle proof's and 6 of the bench's, 480 simulated
seconds in: past the floor of 5, within the 600 s soak; ``--throttle``; the truth is then the
throttled rate). The table, then
notes, go to stdout; ``--json FILE`` writes the rows as [{"name", "value", "unit", "target",
"ok"}]; progress goes to stderr. ``--quick``: one run per disturbance (a second where the first
could not be measured: at these scales a loaded machine's slowness eats much of a budget) at time
scale 1000, 300 for the rows with a budget of their own or a daemon started in their bench; a batch
of 6 where the row sets no budget, no restart where the disturbance needs none (the warmup at the
full workers), the sim's memory (and the cgroup's limit) at an eighth, one manager for the rows
that leave it alone, the disturbances side by side: a check that every row is still measured, not
figures for the target. Exit 0 when every row holds a figure and meets its target, 1 when one is
NOT MEASURED, 3 when a target is missed (a quick run holds only the targets of what must never
happen: ``_harness.held``).

Above time scale 100 the memory sample interval is shortened in the same ratio (a partition is
shorter: the step-down row must still see it), the manager's outage is scaled too, and the rows
that do not set a budget of their own get twice the manager's 45 min: the supervisor's own
real-time work (a restart's interpreter start, slower under load) takes a larger share of a
scaled budget, and a step-down run could be left with no time to measure again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _settings as cfg
import httpx
from _harness import (
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    busy_loops,
    failed,
    free_tcp_port,
    median,
    progress_printer,
    report,
    standard_options,
)

TARGET = 0.01
BASE_TIME_SCALE = 100.0  # the scale the disturbances are written for
QUICK_TIME_SCALE = 1000.0
# --quick, a row that sets a budget of its own: its budget is the point, and a slower clock
# leaves it more than the supervisor's real-time work (a restart, slower under load).
QUICK_BUDGET_TIME_SCALE = 300.0
QUICK_BENCH_COUNT = 6  # --quick: the batch of a row that sets none of its own
FIELD_RUNS = 10  # the field rows: runs at least, the worst counts
BUSY_PER_CORE = 2
THROTTLE = 1.10
THROTTLE_AFTER = 7  # the daemon's completions: the settle proof and 6 bench proofs (the floor: 5)


progress = progress_printer("rate")


@dataclass(frozen=True)
class Disturbance:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    sim_args: tuple[str, ...] = ()
    during: Callable[[SupervisorProc, Manager, float], None] | None = None
    cgroup: bool = False
    restart: bool = False
    """The disturbance needs the restart after the warmup (a quick run skips it otherwise)."""
    field_row: bool = False
    """Issue 32's: at least ``FIELD_RUNS`` runs, the worst counts."""
    seeded: bool = False
    """Each run gets its own ``--chaos-seed`` (the run's number)."""
    busy_per_core: int = 0
    tcp: bool = False
    """The daemon listens on loopback TCP (its listener is the proxy that resets connections)."""
    slows_by: float = 1.0
    """The machine's rate at the end is the steady rate divided by this."""
    respawns_in_bench: bool = False
    """The bench starts a new daemon (a crash, a step-down): its real-time start is a large
    share of a bench at the quick time scale."""

    @property
    def own_budget(self) -> bool:
        return "bench_budget_s_sim" in self.settings

    @property
    def quick_on_a_slower_clock(self) -> bool:
        """A quick run gives it QUICK_BUDGET_TIME_SCALE: its budget is the point, or a daemon's
        start in the bench (seconds on a loaded machine) would eat most of a faster one."""
        return self.own_budget or self.respawns_in_bench

    @property
    def leaves_manager_alone(self) -> bool:
        return self.during is None


def manager_away_in_params(sup: SupervisorProc, manager: Manager, time_scale: float) -> None:
    """The manager refuses connections for 400 simulated seconds (4 s at time scale 100)."""
    sup.wait_event("phase.entered", 60, phase="params")
    refuse_s = 4.0 * BASE_TIME_SCALE / time_scale
    httpx.post(f"{manager.url}/sim/faults", json={"refuse_for": refuse_s}, timeout=5)


def disturbances(root: Path) -> list[Disturbance]:
    return [
        Disturbance("none"),
        Disturbance("manager away through params", during=manager_away_in_params),
        Disturbance(
            "first proof after the restart 10x slow",
            sim_args=(
                "--first-proof-factor",
                "10",
                "--first-proof-factor-after",
                str(root / "first"),
            ),
            restart=True,
        ),
        Disturbance(
            "one daemon crash mid-bench",
            faults=(f"exit:3,after_proofs=4,once={root}/crash",),
            restart=True,  # the proofs are counted from the restart's daemon
            respawns_in_bench=True,
        ),
        Disturbance(
            "proactive step-down in the bench",
            settings={"workers": 20, "max_workers": 20, "bench_count": 16},
            cgroup=True,
            restart=True,
            respawns_in_bench=True,
        ),
        Disturbance(
            "budget for 4 of 12 proofs", settings={"workers": 5, "bench_budget_s_sim": 1300}
        ),
        Disturbance(
            "slow machine: 2 workers, 45 min budget", settings={"bench_budget_s_sim": 2700}
        ),
        Disturbance("every core busy", field_row=True, busy_per_core=BUSY_PER_CORE),
        Disturbance(
            "connection chaos: every connection reset each 0.2-2 s",
            sim_args=("--chaos-resets", "0.2:2"),
            field_row=True,
            seeded=True,
            tcp=True,
        ),
        Disturbance(
            "throttle after the floor: 5 workers, synthesis 10 % slower from the 7th proof",
            settings={"workers": 5},
            sim_args=("--throttle", f"{THROTTLE:g}:{THROTTLE_AFTER}"),
            slows_by=THROTTLE,
            restart=True,  # the bench's daemon counts from its own start
        ),
    ]


def one_run(
    procs: Processes,
    root: Path,
    d: Disturbance,
    time_scale: float,
    shared: Manager | None = None,
    quick: bool = False,
    seed: int = 0,
) -> float:
    """The run's rate error against the model, as a fraction. Against ``shared`` where given
    (a row whose disturbance leaves the manager alone), else a manager of its own. ``quick``: a
    batch of ``QUICK_BENCH_COUNT`` where the row sets no budget, no restart where the row needs
    none (the warmup at the full workers), the sim's memory (and a cgroup's limit) at
    ``QUICK_MEMORY_SCALE``."""
    root.mkdir(parents=True, exist_ok=True)
    manager = shared or Manager(procs, root / "manager.db")
    memory_scale = cfg.QUICK_MEMORY_SCALE if quick else 1.0
    try:
        env = cfg.lifecycle(root, manager.url, time_scale, memory_scale)
        env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
        if quick and not d.own_budget:
            env["CUZK_SUPERVISOR_BENCH_COUNT"] = str(QUICK_BENCH_COUNT)
        if quick and not d.restart:
            workers = d.settings.get("workers", cfg.WORKERS)
            env["CUZK_SUPERVISOR_WARMUP_WORKERS"] = str(workers)
        # The manager's 45 min; twice that above time scale 100 for the rows whose budget is not
        # the point (those that set their own keep it): the supervisor's real-time work (a
        # restart's interpreter start, slower under load) takes a larger share of a scaled one.
        budget_sim_s = 2700 * (2 if time_scale > BASE_TIME_SCALE else 1)
        env["CUZK_SUPERVISOR_BENCH_BUDGET_S"] = str(budget_sim_s / time_scale)
        if time_scale > BASE_TIME_SCALE:
            env["CUZK_SUPERVISOR_MEMORY_SAMPLE_INTERVAL_S"] = str(BASE_TIME_SCALE / time_scale)
        seeded = ("--chaos-seed", str(seed)) if d.seeded else ()
        args = " ".join([cfg.sim_args(time_scale, d.faults, memory_scale), *d.sim_args, *seeded])
        if d.tcp:
            env["CUZK_SUPERVISOR_DAEMON_LISTEN"] = f"127.0.0.1:{free_tcp_port()}"
        for key, value in d.settings.items():
            if key == "bench_budget_s_sim":
                env["CUZK_SUPERVISOR_BENCH_BUDGET_S"] = str(value / time_scale)
            else:
                env[f"CUZK_SUPERVISOR_{key.upper()}"] = str(value)
        if d.cgroup:
            folder = root / "cgroup"
            folder.mkdir()
            (folder / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            (folder / "memory.max").write_text(f"{round(295 * 2**20 * memory_scale)}\n")
            args += f" --cgroup-dir {folder}"
            env["CUZK_SUPERVISOR_CGROUP_ROOT"] = str(folder)
        env["CUZK_SUPERVISOR_DAEMON_ARGS"] = args
        per_core = min(d.busy_per_core, 1) if quick else d.busy_per_core
        loops = busy_loops(procs, per_core * (os.cpu_count() or 1))
        try:
            sup = SupervisorProc(procs, "run", env)
            if d.during is not None:
                d.during(sup, manager, time_scale)
            sup.waiter.join(300)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait(10)
        code = sup.proc.returncode
        sup.dump(root / "events.jsonl")
        if code != 0:
            failures = sup.named("lifecycle.failed")
            why = f": {failures[-1].get('reason')}" if failures else ""
            raise BenchError(f"exit {code}{why}")
        results = sup.named("bench.result")
        if not results:
            raise BenchError("no bench.result")
        result = results[-1]
        how = result["measurement"]
        truth = cfg.steady_rate(result["workers"], how["concurrency"]) / d.slows_by
        error = float(result["rate"]) / truth - 1.0
        late = f"; {how['late']} submitted late" if how.get("late") else ""
        progress(
            f"  {result['rate']:.2f} vs {truth:.2f} proofs/h ({error:+.2%}); {how['reason']}{late}"
        )
        return error
    finally:
        if manager is not shared:
            manager.stop()


def measure(
    procs: Processes,
    work: Path,
    index: int,
    d: Disturbance,
    runs: int,
    time_scale: float,
    spare: int = 0,
    shared: Manager | None = None,
    quick: bool = False,
) -> tuple[Row, list[str]]:
    """The row of one disturbance (the median of its runs' errors; a field row's worst, over
    ``FIELD_RUNS`` runs at least unless quick) and its notes; up to ``spare`` more runs while
    none could be measured (a quick run, on a loaded machine)."""
    if d.field_row and not quick:
        runs = max(runs, FIELD_RUNS)
    errors: list[float] = []
    notes: list[str] = []
    n = 0
    while n < runs or (not errors and n < runs + spare):
        progress(f"{d.name}: run {n + 1}/{runs}")
        try:
            root = work / f"d{index}r{n}"
            errors.append(one_run(procs, root, d, time_scale, shared, quick, seed=n))
        except BenchError as exc:
            notes.append(f"{d.name}, run {n + 1}: {exc}")
        n += 1
    name = f"rate error: {d.name}" + (f" (worst of {len(errors)})" if d.field_row else "")
    if not errors:
        return failed(name, "%", "|x| <= 1", "; ".join(notes) or "no run"), notes
    if d.field_row and len(errors) < runs:
        notes.append(f"{d.name}: only {len(errors)} of {runs} runs measured")
    value = max(errors, key=abs) if d.field_row else median(errors)
    notes.append(f"{d.name}: errors {[round(e * 100, 2) for e in errors]} %")
    return Row(name, round(value * 100, 2), "%", "|x| <= 1", abs(value) <= TARGET), notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per disturbance (median)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help=f"default {BASE_TIME_SCALE:g}; {QUICK_TIME_SCALE:g} quick",
    )
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains this")
    standard_options(
        parser,
        f"1 run each at time scale {QUICK_TIME_SCALE:g} ({QUICK_BUDGET_TIME_SCALE:g} for a row "
        f"with a budget of its own or a daemon started in its bench; 2 runs where the first is "
        f"not measured), batches of "
        f"{QUICK_BENCH_COUNT} where the row sets no budget, no restart where it needs none, the "
        "sim's memory at an eighth, one manager, the disturbances side by side",
    )
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    spare = 1 if args.quick else 0
    scale = args.time_scale or (QUICK_TIME_SCALE if args.quick else BASE_TIME_SCALE)

    def scale_of(d: Disturbance) -> float:
        if args.quick and not args.time_scale and d.quick_on_a_slower_clock:
            return QUICK_BUDGET_TIME_SCALE
        return scale

    work = Path(tempfile.mkdtemp(prefix="rate-bench-"))
    procs = Processes(str(work))
    chosen = [
        (i, d)
        for i, d in enumerate(disturbances(work))
        if not args.only or any(o in d.name for o in args.only)
    ]
    try:
        # A quick run: one manager for the rows that leave it alone.
        shared = Manager(procs, work / "manager.db") if args.quick else None
        # Side by side in a quick run: each lifecycle mostly waits on the sim's scaled time.
        with ThreadPoolExecutor(max_workers=max(1, len(chosen)) if args.quick else 1) as pool:
            measured = list(
                pool.map(
                    lambda item: measure(
                        procs,
                        work,
                        item[0],
                        item[1],
                        runs,
                        scale_of(item[1]),
                        spare,
                        shared if item[1].leaves_manager_alone else None,
                        args.quick,
                    ),
                    chosen,
                )
            )
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    rows = [row for row, _ in measured]
    scales = sorted({scale_of(d) for _, d in chosen}, reverse=True) or [scale]
    notes = [f"time scale {' and '.join(f'{s:g}' for s in scales)}; {runs} run(s) per disturbance"]
    notes += [note for _, own in measured for note in own]
    return report(rows, notes, args.json, args.quick)


if __name__ == "__main__":
    sys.exit(main())
