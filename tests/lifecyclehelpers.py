"""Run ``cuzk-supervisor run`` as a real subprocess against the simulated manager and daemon.

Settings go in as ``CUZK_SUPERVISOR_*`` variables, as an operator's container would set them.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from daemonhelpers import Supervisor
from pacehelpers import scaled
from simhelpers import free_tcp_port

from cuzk_supervisor.sim.daemon.c1 import write_c1

SIM_PARAMS = ("p.params:3000000", "p.vk:1000")


def fetch_command(tmp_path: Path, rate_mb: float = 4.0) -> str:
    """The simulated download, counting its runs in ``fetch-runs`` beside the params."""
    counter = tmp_path / "fetch-runs"
    return (
        f"echo run >> {counter} && {sys.executable} -m cuzk_supervisor.sim.fetch "
        f"--rate-mb {rate_mb:g} " + " ".join(SIM_PARAMS)
    )


def fake_cgroup(folder: Path, limit_bytes: int | None = None) -> Path:
    """A cgroup-like folder for the simulated daemon's ``--cgroup-dir`` (its memory.current
    follows the sim's real allocations) and the supervisor's ``cgroup_root``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    if limit_bytes is not None:
        (folder / "memory.max").write_text(f"{limit_bytes}\n")
    return folder


def fetch_runs(tmp_path: Path) -> int:
    counter = tmp_path / "fetch-runs"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def lifecycle_env(
    tmp_path: Path,
    manager_url: str,
    *,
    time_scale: float | None = None,
    sim_faults: tuple[str, ...] = (),
    sim_args: tuple[str, ...] = (),
    fetch_rate_mb: float = 20.0,
    memory_scale: float = 0.125,
    **settings: Any,
) -> dict[str, str]:
    """Settings for a whole lifecycle in scaled time. The parameters' simulated download takes
    0.15 s at the default ``fetch_rate_mb``; a test that acts inside the params phase or counts
    its progress lines gives 4 (0.75 s). The simulated daemon really allocates ``memory_scale``
    MiB per simulated GiB (its --memory-scale, planned back with 1024 / memory_scale): an eighth
    of the simulator's default, since faulting in those pages was a third of a lifecycle's CPU;
    a test whose memory limits or samples are in real bytes gives 1. ``time_scale`` is by default
    200 on the reference machine, slower on a slow one (pacehelpers); a test that gives its own
    passes it through ``pacehelpers.scaled``."""
    if time_scale is None:
        time_scale = scaled(200.0)
    c1 = tmp_path / "c1.json"
    if not c1.exists():
        write_c1(c1, size_bytes=200_000)
    daemon_args = ["-m", "cuzk_supervisor.sim.daemon", "--time-scale", f"{time_scale:g}",
                   "--memory-scale", f"{memory_scale:g}", *sim_args]  # fmt: skip
    for fault in sim_faults:
        daemon_args += ["--fault", fault]
    values: dict[str, Any] = {
        "label": "C.e2e-test",
        "min_rate": 1,
        "manager_url": manager_url,
        "state_dir": tmp_path / "state",
        "run_dir": tmp_path / "run",
        "log_dir": tmp_path / "log",
        "daemon_binary": sys.executable,
        "daemon_args": shlex.join(daemon_args),
        "daemon_status_listen": f"127.0.0.1:{free_tcp_port()}",
        "daemon_param_cache": tmp_path / "params",
        "daemon_startup_deadline_s": 30,
        "daemon_stop_grace_s": 3,
        "c1_file": c1,
        "gpu_probe": "none",
        "rate_time_scale": time_scale,
        "plan_memory_scale": 1024 / memory_scale,
        "bench_budget_s": 2700 / time_scale,
        "bench_count": 6,
        "status_interval_s": 1,
        "await_deadline_s": 1,
        "params_fetch_command": fetch_command(tmp_path, fetch_rate_mb),
        "params_expected": " ".join(SIM_PARAMS),
        "params_progress_interval_s": 0.2,
        # The warmup at the plan's full count (12 at most): no restart phase, one daemon start
        # instead of two per lifecycle. A test of the restart passes warmup_workers=2.
        "warmup_workers": 12,
        "restart_backoff_initial_s": 0.2,
        "restart_backoff_max_s": 1,
        "health_listen": f"127.0.0.1:{free_tcp_port()}",
        "log_format": "json",
    }
    values.update(settings)
    return {f"CUZK_SUPERVISOR_{k.upper()}": str(v) for k, v in values.items()}


def start_run(env: dict[str, str], *args: str) -> Supervisor:
    return Supervisor(list(args), command="run", env=env)


def reports(manager: Any, path: str) -> list[dict[str, Any]]:
    """Requests to ``path`` the manager answered with success (not faulted)."""
    return [
        r for r in manager.requests(path=path)
        if not r.get("faulted") and 200 <= r["status"] < 300
    ]  # fmt: skip
