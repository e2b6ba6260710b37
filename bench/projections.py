"""The bench's projections against the simulator, and what its status sampling costs the rate.

    .venv/bin/python bench/projections.py [--time-scale S] [--json FILE] [--only NAME ...]
                                          [--quick]

Issue 25. Each case runs the whole lifecycle twice (``supervisor run`` against the simulated
manager and daemon, real processes, scaled time): once as a base whose ``bench.result`` projects
the rate with one change (twice the partition workers, one more proof in flight, one more GPU),
then again with that change made, and compares the rate measured there with the projection.
Target: within 10 %. The base runs are chosen so the change matters: synthesis-bound at 2
workers, feed-bound at one proof in flight, GPU-bound with slow GPUs (``--gpu-factor``).

The sampling row runs the quiet lifecycle with the status sampler on (its field cadence scaled to
the time scale, 0.04 s at the fastest) and off, and compares each rate's error against the
model's steady rate (``sim.pipeline``): the difference must stay within 0.5 % (sampling costs
the measurement nothing visible).

Rows: for each case the projected and the measured rate (proofs/h, information) and the error
(%, target |x| <= 10); the sampling row's difference (percentage points, |x| <= 0.5). The table
and notes go to stdout, progress to stderr; ``--json FILE`` writes the rows. ``--quick``: 6 bench
proofs a run (12 otherwise), only the GPU case (the one whose change is a daemon flag; the others
change a setting the same way). Exit 0 when every row holds a figure
(whatever the targets say), 1 when one is NOT MEASURED.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _settings as cfg
from _harness import (
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    failed,
    info,
    progress_printer,
    report,
    standard_options,
)

TIME_SCALE = 400.0
PROJECTION_TARGET_PCT = 10.0
SAMPLING_TARGET_PCT = 0.5
FIELD_SAMPLE_S = 0.5
"""The status sampler's cadence in the field (``bench_status_sample_s``), scaled by the run's
time scale down to ``FASTEST_SAMPLE_S`` (a short stretch still gets its 8 samples)."""
FASTEST_SAMPLE_S = 0.04


progress = progress_printer("projections")


@dataclass(frozen=True)
class Case:
    """A base run, the projection it is asked for, and the run with that change made."""

    name: str
    projection: str
    """``bound.projections[].name`` in the base run's ``bench.result``."""
    base: dict[str, Any]
    changed: dict[str, Any]
    sim_args: tuple[str, ...] = ()
    changed_sim_args: tuple[str, ...] = ()


CASES = (
    Case("twice the partition workers", "more-workers", {"workers": 2}, {"workers": 4}),
    Case(
        "one more in flight",
        "one-more-in-flight",
        {"workers": 5, "bench_concurrency": 1},
        {"workers": 5, "bench_concurrency": 2},
    ),
    Case(
        "one more GPU",
        "one-more-gpu",
        {"workers": 5},
        {"workers": 5},
        sim_args=("--gpu-factor", "8"),
        changed_sim_args=("--gpu-factor", "8", "--gpus", "2"),
    ),
)


def one_run(
    procs: Processes,
    root: Path,
    time_scale: float,
    bench_count: int,
    settings: dict[str, Any],
    sim_args: tuple[str, ...] = (),
    memory_scale: float = 1.0,
) -> dict[str, Any]:
    """One lifecycle to its report; its ``bench.result``."""
    root.mkdir(parents=True, exist_ok=True)
    manager = Manager(procs, root / "manager.db")
    try:
        env = cfg.lifecycle(root, manager.url, time_scale, memory_scale)
        env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
        env["CUZK_SUPERVISOR_BENCH_COUNT"] = str(bench_count)
        # The memory sampler at the field's cadence in simulated time (a partition is short).
        env["CUZK_SUPERVISOR_MEMORY_SAMPLE_INTERVAL_S"] = str(100 / time_scale)
        env["CUZK_SUPERVISOR_BENCH_STATUS_SAMPLE_S"] = str(
            max(FASTEST_SAMPLE_S, FIELD_SAMPLE_S / time_scale)
        )
        for key, value in settings.items():
            env[f"CUZK_SUPERVISOR_{key.upper()}"] = str(value)
        env["CUZK_SUPERVISOR_DAEMON_ARGS"] = " ".join(
            [cfg.sim_args(time_scale, memory_scale=memory_scale), *sim_args]
        )
        sup = SupervisorProc(procs, "run", env)
        sup.waiter.join(300)
        sup.dump(root / "events.jsonl")
        if sup.proc.returncode != 0:
            failures = sup.named("lifecycle.failed")
            why = f": {failures[-1].get('reason')}" if failures else ""
            raise BenchError(f"exit {sup.proc.returncode}{why}")
        results = sup.named("bench.result")
        if not results:
            raise BenchError("no bench.result")
        return results[-1]
    finally:
        manager.stop()


def projected(result: dict[str, Any], name: str) -> tuple[float, str]:
    """The projection ``name`` of a ``bench.result``: its rate and the bound it was made under."""
    bound = result.get("bound") or {}
    for p in bound.get("projections") or []:
        if p.get("name") == name and p.get("rate"):
            return float(p["rate"]), str(bound.get("bound"))
    raise BenchError(f"no {name} projection (bound: {bound.get('bound')}: {bound.get('reason')})")


def measure_case(
    procs: Processes,
    work: Path,
    case: Case,
    time_scale: float,
    bench_count: int,
    memory_scale: float = 1.0,
) -> tuple[list[Row], list[str]]:
    name = f"projection error: {case.name}"
    target = f"|x| <= {PROJECTION_TARGET_PCT:g}"
    try:
        progress(f"{case.name}: base run")
        base = one_run(
            procs, work / "base", time_scale, bench_count, case.base, case.sim_args, memory_scale
        )
        rate, bound = projected(base, case.projection)
        progress(f"{case.name}: run with the change")
        after = one_run(
            procs, work / "changed", time_scale, bench_count, case.changed,
            case.changed_sim_args, memory_scale,
        )  # fmt: skip
    except BenchError as exc:
        return [failed(name, "%", target, str(exc))], [f"{case.name}: {exc}"]
    measured = float(after["rate"])
    error = (measured / rate - 1) * 100
    note = (
        f"{case.name}: base {float(base['rate']):.2f} proofs/h ({bound}), projected {rate:.2f}, "
        f"measured {measured:.2f} ({error:+.1f} %)"
    )
    progress(note)
    return [
        info(f"projected: {case.name}", round(rate, 2), "proofs/h"),
        info(f"measured: {case.name}", round(measured, 2), "proofs/h"),
        Row(name, round(error, 2), "%", target, abs(error) <= PROJECTION_TARGET_PCT),
    ], [note]


def measure_sampling(
    procs: Processes, work: Path, time_scale: float, bench_count: int
) -> tuple[list[Row], list[str]]:
    name = "rate error, sampling on minus off"
    target = f"|x| <= {SAMPLING_TARGET_PCT:g}"
    errors: dict[str, float] = {}
    try:
        for label, sample_s in (("on", None), ("off", 0)):
            progress(f"sampling {label}")
            settings = {} if sample_s is None else {"bench_status_sample_s": sample_s}
            result = one_run(procs, work / label, time_scale, bench_count, settings)
            if label == "on" and not (result.get("bound") or {}).get("evidence", {}).get("samples"):
                raise BenchError("sampling on, but no status sample was taken")
            truth = cfg.steady_rate(result["workers"], result["measurement"]["concurrency"])
            errors[label] = (float(result["rate"]) / truth - 1) * 100
    except BenchError as exc:
        return [failed(name, "pp", target, str(exc))], [f"sampling: {exc}"]
    difference = errors["on"] - errors["off"]
    note = f"sampling: rate error on {errors['on']:+.2f} %, off {errors['off']:+.2f} %"
    progress(note)
    return [
        info("rate error, sampling on", round(errors["on"], 2), "%"),
        info("rate error, sampling off", round(errors["off"], 2), "%"),
        Row(name, round(difference, 2), "pp", target, abs(difference) <= SAMPLING_TARGET_PCT),
    ], [note]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    parser.add_argument("--only", nargs="*", default=None, help="cases whose name contains this")
    standard_options(parser, "6 bench proofs a run, only the GPU case")
    args = parser.parse_args(argv)
    bench_count = 6 if args.quick else 12
    # Quick: the sim's memory at an eighth (its page faults were most of a quick run's CPU).
    memory = cfg.QUICK_MEMORY_SCALE if args.quick else 1.0
    work = Path(tempfile.mkdtemp(prefix="projections-bench-"))
    procs = Processes(str(work))
    jobs: list[tuple[str, Any]] = [
        (c.name, lambda i=i, c=c: measure_case(procs, work / f"c{i}", c, args.time_scale,
                                                   bench_count, memory))
        for i, c in enumerate(CASES)
    ]  # fmt: skip
    jobs.append(
        ("sampling", lambda: measure_sampling(procs, work / "s", args.time_scale, bench_count))
    )
    only = ["GPU"] if args.quick and not args.only else args.only
    chosen = [job for name, job in jobs if not only or any(o in name for o in only)]
    try:
        measured = [job() for job in chosen]
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    rows = [row for own, _ in measured for row in own]
    notes = [f"time scale {args.time_scale:g}; {bench_count} bench proofs a run"]
    notes += [note for _, own in measured for note in own]
    return report(rows, notes, args.json)


if __name__ == "__main__":
    sys.exit(main())
