"""How soon the run phase's health watch notices a fault and acts, against the bounds
docs/run-phase.md states, measured on whole lifecycles (issue 34).

    .venv/bin/python bench/health_detect.py [--quick] [--json FILE] [--time-scale 200]

Each scenario is one ``supervisor run`` against the sim manager and daemon, with production-like
demand in the run phase (``sim.demand`` as the worker command), the GPUs' condition in a
``--gpu-dir`` and the fake NVML reading it; the fault fires after the bench's proofs. From the
supervisor's own event timestamps: the daemon's "sim fault firing" line (as the supervisor read
it) to the first ``health.changed`` about it ("noticed") and to its action (``health.restart`` or
``health.telling_manager``: "acted"), in seconds of wall time. The watch's thresholds are scaled
to the run (``I`` = ``health_interval_s`` 0.2 s; ``health_stuck_min_s`` 0.5 s). Targets: noticed
within docs/run-phase.md's bound (an XID: ``I`` plus one read, taken as 2 ``I``; a stuck partition:
its threshold plus 2 ``I``); acted within ``I`` plus the reason's push after being noticed (taken
as 2 ``I``). On a loaded machine the event loop's own lateness shows in the figures. ``--quick``
runs the lost GPU and the stuck partition only.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import _settings as cfg
from _harness import (
    PY,
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    at_most,
    event_ts,
    failed,
    free_tcp_port,
    progress_printer,
    report,
    standard_options,
)

INTERVAL_S = 0.2
STUCK_MIN_S = 0.5
BENCH_PROOFS = 8  # warmup 1, settle 1, a fixed bench of 6: the fault fires after 10
SCENARIOS: dict[str, tuple[str, str, float]] = {
    # name: (fault, the action's event, the noticed bound in seconds)
    "gpu lost (XID 79)": ("gpu-lost:0,after_proofs=10", "health.telling_manager", 2 * INTERVAL_S),
    "partition stuck": ("stuck,after_proofs=10", "health.restart", STUCK_MIN_S + 2 * INTERVAL_S),
    "uncorrectable ECC (XID 48)": ("xid:48,after_proofs=10", "health.restart", 2 * INTERVAL_S),
    "page retired (XID 63)": ("xid:63,after_proofs=10", "", 2 * INTERVAL_S),
}
QUICK = ("gpu lost (XID 79)", "partition stuck")


def scenario_env(root: Path, manager_url: str, time_scale: float, fault: str) -> dict[str, str]:
    env = cfg.lifecycle(root, manager_url, time_scale, cfg.QUICK_MEMORY_SCALE)
    gpus = root / "gpus"
    gpus.mkdir(parents=True, exist_ok=True)
    port = free_tcp_port()
    demand = shlex.join([
        PY, "-m", "cuzk_supervisor.sim.demand", "--listen", f"127.0.0.1:{port}",
        "--c1", str(root / "c1.json"), "--time-scale", f"{time_scale:g}",
        "--pattern", "busy:1000h@2",
    ])  # fmt: skip
    values: dict[str, Any] = {
        "daemon_args": cfg.sim_args(time_scale, (fault,), cfg.QUICK_MEMORY_SCALE)
        + f" --gpu-dir {shlex.quote(str(gpus))}",
        "daemon_listen": f"127.0.0.1:{port}",
        "gpu_probe": "sim",
        "worker_commands": shlex.quote(demand),
        "workers": 12,
        "warmup_workers": 12,
        "bench_count": BENCH_PROOFS - 2,
        "bench_precision": 0,
        "health_interval_s": INTERVAL_S,
        "health_stuck_min_s": STUCK_MIN_S,
        "health_gpu_lost_s": 3 * INTERVAL_S,
    }
    return {**env, **cfg.to_env(values)}


def _fault_firing(event: dict[str, Any]) -> bool:
    return event.get("event") == "child.line" and "sim fault firing" in str(event.get("line"))


def one(procs: Processes, root: Path, time_scale: float, name: str) -> list[Row]:
    fault, action, bound = SCENARIOS[name]
    root.mkdir(parents=True, exist_ok=True)
    manager = Manager(procs, root / "manager.db")
    try:
        sup = SupervisorProc(procs, "run", scenario_env(root, manager.url, time_scale, fault))
        try:
            fired = sup.wait_for(_fault_firing, 120, "the fault firing")
            noticed = sup.wait_for(lambda e: e.get("event") == "health.changed", 30,
                                   "health.changed")  # fmt: skip
            acted = sup.wait_event(action, 30) if action else None
        finally:
            if sup.proc.poll() is None:
                sup.stop()
            sup.dump(root / "events.jsonl")
    finally:
        manager.stop()
    at = event_ts(fired)
    rows = [at_most(f"{name}: noticed after the fault", event_ts(noticed) - at, "s", bound)]
    if acted is not None:
        rows.append(at_most(f"{name}: acted on after noticed", event_ts(acted) - event_ts(noticed),
                            "s", 2 * INTERVAL_S))  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=200.0)
    standard_options(parser, "the lost GPU and the stuck partition only")
    args = parser.parse_args()
    say = progress_printer("health")
    names = QUICK if args.quick else tuple(SCENARIOS)
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="health-bench-"))
    procs = Processes(str(work))
    try:
        for i, name in enumerate(names):
            say(f"{name} ...")
            try:
                rows += one(procs, work / f"s{i}", args.time_scale, name)
            except BenchError as exc:
                rows.append(failed(f"{name}: noticed after the fault", "s", "", str(exc)))
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    notes = [
        f"time scale {args.time_scale:g}; health_interval_s {INTERVAL_S:g} s; from the "
        "supervisor's own event timestamps (the fault: the daemon's line as it was read)",
    ]
    return report(rows, notes, args.json, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
