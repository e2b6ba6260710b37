"""Run-phase health runs for the end-to-end tests and the fault matrix (issue 34): a whole
lifecycle against the simulated manager and daemon, reaching the run phase with production-like
demand (``sim.demand`` as the worker command, curio's stand-in), the GPUs' condition kept in a
``--gpu-dir`` the fake NVML reads (``gpu_probe`` sim), and the health watch's thresholds scaled
to the test's time (real seconds; the daemon runs ``time_scale`` times faster)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from lifecyclehelpers import lifecycle_env
from simhelpers import free_tcp_port

TIME_SCALE = 200.0
BENCH_PROOFS = 8
"""Proofs completed when the run phase begins: warmup 1, settle 1, a fixed bench of 6."""
HEALTH = {
    "health_interval_s": 0.2,
    "health_gpu_lost_s": 0.6,
    "health_failing_s": 1.5,
    "health_stuck_min_s": 0.5,
    "health_throttle_s": 1.0,
    "health_exit_window_s": 60,
}
"""The watch's thresholds in the tests' real seconds (0.5 s is 100 s of the daemon's time)."""


def demand_command(tmp_path: Path, port: int, pattern: str, time_scale: float) -> str:
    c1 = tmp_path / "c1.json"
    return shlex.join([
        sys.executable, "-m", "cuzk_supervisor.sim.demand", "--listen", f"127.0.0.1:{port}",
        "--c1", str(c1), "--time-scale", f"{time_scale:g}", "--pattern", pattern,
    ])  # fmt: skip


def run_phase_env(
    tmp_path: Path,
    manager_url: str,
    *,
    faults: tuple[str, ...] = (),
    pattern: str = "busy:1000h@2",
    time_scale: float = TIME_SCALE,
    sim_args: tuple[str, ...] = (),
    **settings: Any,
) -> dict[str, str]:
    """A lifecycle that goes on into the run phase with demand and a watched health."""
    env = lifecycle_env(
        tmp_path, manager_url, time_scale=time_scale, sim_faults=faults, sim_args=sim_args,
        bench_count=BENCH_PROOFS - 2,
    )  # fmt: skip
    return with_run_phase(env, tmp_path, pattern=pattern, time_scale=time_scale, **settings)


def with_run_phase(
    env: dict[str, str],
    tmp_path: Path,
    *,
    pattern: str = "busy:1000h@2",
    time_scale: float = TIME_SCALE,
    **settings: Any,
) -> dict[str, str]:
    """``env`` (``lifecycle_env``'s) made to go on into the run phase: the daemon on a TCP port
    the demand reaches it at, the GPUs' condition in a ``--gpu-dir`` the fake NVML reads, the
    bench a fixed batch (a fault's ``after_proofs`` then falls in the run phase), the watch's
    thresholds scaled."""
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    port = free_tcp_port()
    values: dict[str, Any] = {
        "exit_after_run": "false",
        "daemon_listen": f"127.0.0.1:{port}",
        "gpu_probe": "sim",
        "worker_commands": shlex.quote(demand_command(tmp_path, port, pattern, time_scale)),
        "bench_precision": 0,
        **HEALTH,
        **settings,
    }
    out = dict(env)
    out["CUZK_SUPERVISOR_DAEMON_ARGS"] += f" --gpu-dir {shlex.quote(str(gpus))}"
    out.update({f"CUZK_SUPERVISOR_{k.upper()}": str(v) for k, v in values.items()})
    return out


def setup_lines(manager: Any, uuid: str) -> list[dict[str, Any]]:
    return manager.logs(uuid, source="setup", tail=10000)
