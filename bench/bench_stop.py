"""A bench that stops when it knows (issue 25, item 5): the fixed batch against the adaptive stop.

    .venv/bin/python bench/bench_stop.py [--time-scale S] [--runs N] [--json FILE] [--quick]

Each row runs the whole lifecycle (``supervisor run`` against the simulated manager and daemon,
real processes, scaled time) at the suite's plan (2 partition workers, 12 bench proofs at
concurrency 2, ``bench/_settings.py``) in two cases and two modes:

- a quiet machine, its rate far from ``MIN_RATE`` (1 proof/hour);
- near ``MIN_RATE``: the minimum 0.2 % under the model's steady rate;
- fixed: ``bench_precision`` 0, today's batch of ``bench_count``; adaptive: the default
  (±1 %, no early stop before ``bench_min_soak_s`` nor on a moving machine, going on up to
  ``bench_max_proofs`` while the rate is not known or too close to the minimum to tell).

It prints, for each, the time from the supervisor's start to its ``/bench-done`` being
acknowledged, the proofs the bench used (submitted, in every stretch), the rate's error
against the model's steady rate (``sim.daemon.pipeline``, completions 100..500 of a long closed
loop) and why the batch stopped. Targets: on the quiet machine the adaptive verdict comes at least
25 % sooner with the rate still within 1 % (as is the fixed batch's). At this time scale the
supervisor's own scheduling (tens of ms on a loaded machine) is several per cent of a 1.52 s
interval: spread the adaptive stop does not trust, so a loaded machine's runs stop later;
``bench/stop_stats.py`` measures the claim over 200 seeded runs in virtual time.
``--json FILE`` writes the rows as [{"name", "value", "unit", "target", "ok"}]; progress goes
to stderr. ``--quick``:
time scale 1000, a batch of 6 proofs (adaptive: 12 at most), no restart (the warmup at the
full workers), the sim's memory at an eighth, one manager, the four runs side by side (its
figures show that everything is measured; the sim's timer lateness is larger there). Exit 0 when
every row holds a figure and meets its target, 1 when one is NOT MEASURED, 3 when a target is
missed (a quick run holds only the targets of what must never happen: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _settings as cfg
from _harness import (
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    at_least,
    event_ts,
    failed,
    info,
    median,
    progress_printer,
    report,
    standard_options,
)

BASE_TIME_SCALE = 100.0
QUICK_TIME_SCALE = 1000.0
QUICK_BENCH_COUNT = 6  # --quick: the batch (and, adaptive, twice it at most)
SOONER_TARGET_PCT = 25.0
RATE_TARGET_PCT = 1.0
NEAR_MARGIN = 0.002  # the minimum this far under the steady rate


progress = progress_printer("stop")


@dataclass(frozen=True)
class Outcome:
    seconds: float
    """From the supervisor's start to its /bench-done acknowledged."""
    proofs: int
    """Bench proofs submitted, every stretch."""
    error: float
    """The reported rate against the model's steady rate, as a fraction."""
    stopped: str
    passed: bool | None


def one_run(
    procs: Processes,
    root: Path,
    min_rate: float,
    adaptive: bool,
    scale: float,
    shared: Manager | None = None,
) -> Outcome:
    """One lifecycle against its own manager; a quick run's (``shared`` given: one manager for
    them all) has a smaller batch, no restart (warmup at the full workers) and the sim's memory
    at ``QUICK_MEMORY_SCALE``."""
    root.mkdir(parents=True, exist_ok=True)
    quick = shared is not None
    manager = shared or Manager(procs, root / "manager.db")
    try:
        memory_scale = cfg.QUICK_MEMORY_SCALE if quick else 1.0
        env = cfg.lifecycle(root, manager.url, scale, memory_scale)
        env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
        if quick:
            env["CUZK_SUPERVISOR_BENCH_COUNT"] = str(QUICK_BENCH_COUNT)
            env["CUZK_SUPERVISOR_BENCH_MAX_PROOFS"] = str(2 * QUICK_BENCH_COUNT)
            env["CUZK_SUPERVISOR_WARMUP_WORKERS"] = str(cfg.WORKERS)
        env["CUZK_SUPERVISOR_MIN_RATE"] = f"{min_rate:.6g}"
        if not adaptive:
            env["CUZK_SUPERVISOR_BENCH_PRECISION"] = "0"
        sup = SupervisorProc(procs, "run", env)
        sup.waiter.join(300)
        sup.dump(root / "events.jsonl")
        results = sup.named("bench.result")
        if not results:
            failures = sup.named("lifecycle.failed")
            why = f": {failures[-1].get('reason')}" if failures else ""
            raise BenchError(f"no bench.result (exit {sup.proc.returncode}{why})")
        acknowledged = [
            e
            for e in sup.named("manager.report_done")
            if e.get("kind") == "bench_done" and e.get("outcome") == "ok"
        ]
        if not acknowledged:
            raise BenchError(f"no /bench-done acknowledged (exit {sup.proc.returncode})")
        seconds = event_ts(acknowledged[0]) - sup.started_wall
        proofs = sum(int(e.get("submitted", 0)) for e in sup.named("bench.stretch_done"))
        result = results[-1]
        how = result["measurement"]
        truth = cfg.steady_rate(result["workers"], how["concurrency"])
        error = float(result["rate"]) / truth - 1.0
        passed = bool(sup.named("bench.passed")) or (False if sup.named("bench.failed") else None)
        mode = "adaptive" if adaptive else "fixed"
        progress(
            f"  {mode} min_rate {min_rate:.3f}: {seconds:.1f} s, {proofs} proofs, rate "
            f"{result['rate']:.3f} vs {truth:.3f} ({error:+.2%}), stopped {how.get('stopped')!r}"
            f" ±{how.get('uncertainty_pct')} %"
        )
        return Outcome(seconds, proofs, error, str(how.get("stopped", "")), passed)
    finally:
        if manager is not shared:
            manager.stop()


def runs_of(
    procs: Processes,
    work: Path,
    tag: str,
    min_rate: float,
    adaptive: bool,
    runs: int,
    scale: float,
    shared: Manager | None,
) -> tuple[list[Outcome], list[str]]:
    """``runs`` runs (one more, in a quick run, while none could be measured)."""
    outcomes: list[Outcome] = []
    notes: list[str] = []
    n = 0
    while n < runs or (not outcomes and n < runs + 1):
        progress(f"{tag}: run {n + 1}/{runs}")
        try:
            outcomes.append(one_run(procs, work / f"{tag}-{n}", min_rate, adaptive, scale, shared))
        except BenchError as exc:
            notes.append(f"{tag}, run {n + 1}: {exc}")
        n += 1
    return outcomes, notes


def rows_for(case: str, fixed: list[Outcome], adaptive: list[Outcome]) -> list[Row]:
    rows: list[Row] = []
    for mode, outcomes in (("fixed", fixed), ("adaptive", adaptive)):
        name = f"{case}, {mode}"
        if not outcomes:
            rows.append(failed(f"{name}: start to /bench-done", "s", "", "no run measured"))
            continue
        rows.append(
            info(f"{name}: start to /bench-done", median([o.seconds for o in outcomes]), "s")
        )
        rows.append(info(f"{name}: bench proofs", median([o.proofs for o in outcomes]), "proofs"))
        error = median([o.error for o in outcomes]) * 100
        if case == "quiet":
            rows.append(
                Row(
                    f"{name}: rate error",
                    round(error, 3),
                    "%",
                    f"|x| <= {RATE_TARGET_PCT:g}",
                    abs(error) <= RATE_TARGET_PCT,
                )
            )
        else:
            rows.append(info(f"{name}: rate error", round(error, 3), "%"))
    if fixed and adaptive:
        before = median([o.seconds for o in fixed])
        after = median([o.seconds for o in adaptive])
        sooner = (1 - after / before) * 100
        if case == "quiet":
            rows.append(at_least(f"{case}: adaptive verdict sooner", round(sooner, 1), "%",
                                 SOONER_TARGET_PCT))  # fmt: skip
        else:
            rows.append(info(f"{case}: adaptive verdict sooner", round(sooner, 1), "%"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per case and mode (median)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help=f"default {BASE_TIME_SCALE:g}; {QUICK_TIME_SCALE:g} quick",
    )
    standard_options(
        parser,
        f"1 run each at time scale {QUICK_TIME_SCALE:g}, batches of {QUICK_BENCH_COUNT} (at most "
        f"{2 * QUICK_BENCH_COUNT}), no restart, one manager, side by side",
    )
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    scale = args.time_scale or (QUICK_TIME_SCALE if args.quick else BASE_TIME_SCALE)
    truth = cfg.steady_rate(cfg.WORKERS, cfg.BENCH_CONCURRENCY)
    cases = {"quiet": 1.0, "near MIN_RATE": truth * (1 - NEAR_MARGIN)}
    plan = [(case, adaptive) for case in cases for adaptive in (False, True)]
    work = Path(tempfile.mkdtemp(prefix="stop-bench-"))
    procs = Processes(str(work))
    try:
        shared = Manager(procs, work / "manager.db") if args.quick else None
        # Side by side in a quick run: each lifecycle mostly waits on the sim's scaled time.
        with ThreadPoolExecutor(max_workers=len(plan) if args.quick else 1) as pool:
            done = list(
                pool.map(
                    lambda item: runs_of(
                        procs,
                        work,
                        f"{item[0].split()[0]}-{'adaptive' if item[1] else 'fixed'}",
                        cases[item[0]],
                        item[1],
                        runs,
                        scale,
                        shared,
                    ),
                    plan,
                )
            )
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    by = dict(zip(plan, done, strict=True))
    rows: list[Row] = []
    notes: list[str] = []
    for case in cases:
        (fixed, fixed_notes), (adaptive, adaptive_notes) = by[(case, False)], by[(case, True)]
        rows += rows_for(case, fixed, adaptive)
        notes += fixed_notes + adaptive_notes
        for mode, outcomes in (("fixed", fixed), ("adaptive", adaptive)):
            stops = ", ".join(sorted({o.stopped for o in outcomes})) or "-"
            verdicts = ", ".join(
                sorted(
                    {
                        "passed" if o.passed else "failed" if o.passed is False else "-"
                        for o in outcomes
                    }
                )
            )
            notes.append(f"{case}, {mode}: stopped {stops}; verdict {verdicts}")
    heading = (
        f"time scale {scale:g}; {runs} run(s) each; steady rate {truth:.3f} proofs/hour; "
        f"near MIN_RATE: min_rate {cases['near MIN_RATE']:.3f}"
    )
    return report(rows, [heading, *notes], args.json, args.quick)


if __name__ == "__main__":
    sys.exit(main())
