"""The reported rate under ordinary disturbances, against the simulator's steady rate.

    .venv/bin/python bench/rate_disturbance.py [--runs N] [--time-scale S] [--json FILE]
                                               [--only NAME ...]

Each row runs the whole lifecycle (``supervisor run`` against the simulated manager and daemon,
real processes, scaled time) with one disturbance, and compares the rate the manager received
with the model's steady rate of the plan the run ended on (``sim.pipeline``: completions 100 to
500 of a long closed loop at the bench's concurrency). Target: |error| <= 2 % in every row. The
table, then notes, go to stdout; ``--json FILE`` writes the rows as
[{"name", "value", "unit", "target", "ok"}]; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _settings as cfg
import httpx
from _harness import BenchError, Manager, Processes, Row, SupervisorProc, median, print_table

from cuzk_supervisor.sim.pipeline import simulate_closed_loop

TARGET = 0.02
SIM_GPU_WORKERS = 2


def steady_rate(workers: int, concurrency: int) -> float:
    done = simulate_closed_loop(workers, SIM_GPU_WORKERS, concurrency, 500)
    return (len(done) - 100) / (done[-1] - done[99]) * 3600


def progress(message: str) -> None:
    print(f"[rate {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Disturbance:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    sim_args: tuple[str, ...] = ()
    during: Callable[[SupervisorProc, Manager], None] | None = None
    cgroup: bool = False


def manager_away_in_params(sup: SupervisorProc, manager: Manager) -> None:
    sup.wait_event("phase.entered", 60, phase="params")
    httpx.post(f"{manager.url}/sim/faults", json={"refuse_for": 4.0}, timeout=5)


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
        ),
        Disturbance(
            "one daemon crash mid-bench", faults=(f"exit:3,after_proofs=4,once={root}/crash",)
        ),
        Disturbance(
            "proactive step-down in the bench",
            settings={"workers": 20, "max_workers": 20, "bench_count": 16},
            cgroup=True,
        ),
        Disturbance(
            "budget for 4 of 12 proofs", settings={"workers": 5, "bench_budget_s_sim": 1300}
        ),
        Disturbance(
            "slow machine: 2 workers, 45 min budget", settings={"bench_budget_s_sim": 2700}
        ),
    ]


def one_run(procs: Processes, root: Path, d: Disturbance, time_scale: float) -> float:
    """The run's rate error against the model, as a fraction."""
    root.mkdir(parents=True, exist_ok=True)
    manager = Manager(procs, root / "manager.db")
    try:
        env = cfg.lifecycle(root, manager.url, time_scale)
        env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
        env["CUZK_SUPERVISOR_BENCH_BUDGET_S"] = str(2700 / time_scale)
        args = " ".join([cfg.sim_args(time_scale, d.faults), *d.sim_args])
        for key, value in d.settings.items():
            if key == "bench_budget_s_sim":
                env["CUZK_SUPERVISOR_BENCH_BUDGET_S"] = str(value / time_scale)
            else:
                env[f"CUZK_SUPERVISOR_{key.upper()}"] = str(value)
        if d.cgroup:
            folder = root / "cgroup"
            folder.mkdir()
            (folder / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            (folder / "memory.max").write_text(f"{295 * 2**20}\n")
            args += f" --cgroup-dir {folder}"
            env["CUZK_SUPERVISOR_CGROUP_ROOT"] = str(folder)
        env["CUZK_SUPERVISOR_DAEMON_ARGS"] = args
        sup = SupervisorProc(procs, "run", env)
        if d.during is not None:
            d.during(sup, manager)
        sup.waiter.join(300)
        code = sup.proc.returncode
        sup.dump(root / "events.jsonl")
        if code != 0:
            raise BenchError(f"exit {code}")
        results = sup.named("bench.result")
        if not results:
            raise BenchError("no bench.result")
        result = results[-1]
        how = result["measurement"]
        truth = steady_rate(result["workers"], how["concurrency"])
        error = float(result["rate"]) / truth - 1.0
        progress(f"  {result['rate']:.2f} vs {truth:.2f} proofs/h ({error:+.2%}); {how['reason']}")
        return error
    finally:
        manager.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per disturbance (median)")
    parser.add_argument("--time-scale", type=float, default=100.0)
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains this")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rate-bench-"))
    rows: list[Row] = []
    notes: list[str] = []
    procs = Processes(str(work))
    try:
        for i, d in enumerate(disturbances(work)):
            if args.only and not any(o in d.name for o in args.only):
                continue
            errors: list[float] = []
            for n in range(args.runs):
                progress(f"{d.name}: run {n + 1}/{args.runs}")
                try:
                    errors.append(one_run(procs, work / f"d{i}r{n}", d, args.time_scale))
                except BenchError as exc:
                    notes.append(f"{d.name}, run {n + 1}: {exc}")
            if not errors:
                rows.append(Row(f"rate error: {d.name} [not measured]", None, "%", "<= 2"))
                continue
            value = median(errors)
            ok = abs(value) <= TARGET
            rows.append(Row(f"rate error: {d.name}", round(value * 100, 2), "%", "|x| <= 2", ok))
            notes.append(f"{d.name}: errors {[round(e * 100, 2) for e in errors]} %")
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    for note in notes:
        print(f"- {note}")
    document = [row.as_dict() for row in rows]
    print(json.dumps(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
