"""Build the value objects each module takes from the one ``Settings`` object.

Modules keep their own small frozen values (``ProvingTimeouts``, ``DaemonSettings``,
``RestartPolicy``, ``MemoryPolicy`` …) so they can be used and tested alone; this is the only
place that knows how settings map onto them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cuzk_supervisor.adapters.machine.gpu import GpuProbe, NvmlProbe, SimStatusProbe, StaticProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.core.bench import BenchPolicy
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.restart import RestartPolicy
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.daemon.process import DaemonSettings
from cuzk_supervisor.settings import Settings

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerTimeouts
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts


def memory_policy(s: Settings) -> MemoryPolicy:
    return MemoryPolicy(
        safety_margin_fraction=s.memory_margin_fraction,
        safety_margin_min_gib=s.memory_margin_min_gib,
        base_gib=s.memory_base_gib,
        per_worker_gib=s.memory_per_worker_gib,
        max_workers=s.max_workers,
        warmup_workers=s.warmup_workers,
    )


def risk_policy(s: Settings) -> RiskPolicy:
    return RiskPolicy(
        interval_s=s.memory_sample_interval_s,
        fast_interval_s=s.memory_alert_sample_interval_s,
    )


def restart_policy(s: Settings) -> RestartPolicy:
    return RestartPolicy(
        initial_backoff_s=s.restart_backoff_initial_s,
        max_backoff_s=s.restart_backoff_max_s,
        stable_after_s=s.restart_stable_after_s,
        crash_loop_failures=s.crash_loop_failures,
        crash_loop_window_s=s.crash_loop_window_s,
    )


def proving_timeouts(s: Settings) -> ProvingTimeouts:
    # Not at the top: proving.policy loads grpc and tenacity, and ``plan`` and ``daemon`` use
    # this module without ever proving.
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts

    return ProvingTimeouts(
        submit_deadline_s=s.submit_deadline_s,
        await_deadline_s=s.await_deadline_s,
        proof_budget_s=s.proof_budget_s,
        startup_deadline_s=s.daemon_startup_deadline_s,
    )


def manager_timeouts(s: Settings) -> ManagerTimeouts:
    from cuzk_supervisor.adapters.manager.values import ManagerTimeouts  # loads httpx: see above

    return ManagerTimeouts(connect_s=s.manager_connect_timeout_s, read_s=s.manager_read_timeout_s)


def manager_retry(s: Settings) -> ManagerRetry:
    from cuzk_supervisor.adapters.manager.values import ManagerRetry

    return ManagerRetry(
        backoff_base_s=s.manager_backoff_initial_s,
        backoff_max_s=s.manager_backoff_max_s,
        report_stop_s=s.manager_retry_s,
    )


def daemon_listen(s: Settings) -> str:
    return s.daemon_listen or f"unix://{(s.run_dir / 'cuzk.sock').resolve()}"


def daemon_settings(s: Settings, cgroup_dir: Path | None) -> DaemonSettings:
    return DaemonSettings(
        binary=s.daemon_binary,
        extra_args=s.daemon_args,
        config_path=s.run_dir / "cuzk.toml",
        base_config=s.daemon_base_config,
        log_path=s.log_dir / "cuzk.log",
        log_max_bytes=s.daemon_log_max_bytes,
        log_backups=s.daemon_log_backups,
        startup_deadline_s=s.daemon_startup_deadline_s,
        stop_grace_s=s.daemon_stop_grace_s,
        liveness_interval_s=s.daemon_liveness_interval_s,
        liveness_timeout_s=s.daemon_liveness_timeout_s,
        liveness_failures=s.daemon_liveness_failures,
        cgroup_dir=cgroup_dir,
    )


def memory_sampler(s: Settings, environ: Mapping[str, str] = os.environ) -> MemorySampler:
    """The memory sampler the plan and the memory watch read: the host's, or, when the daemon is
    the simulator with its RAM given (``--host-gib``), the simulated machine's RAM."""
    from cuzk_supervisor.sim import probes as sim  # not at the top: it imports this module

    return sim.memory_sampler(s, sim.machine_of(s, environ))


def gpu_probe(s: Settings, environ: Mapping[str, str] = os.environ) -> GpuProbe:
    """The GPU probe ``gpu_probe`` names; against the simulator it knows the simulated GPUs
    before any daemon answers (they are idle then), so the plan sees them."""
    from cuzk_supervisor.sim import probes as sim  # not at the top: it imports this module

    return sim.gpu_probe(s, sim.machine_of(s, environ))


def host_memory_sampler(s: Settings) -> MemorySampler:
    """The machine's own memory, whatever the daemon is."""
    if s.cgroup_root is not None:
        # An explicit cgroup folder (tests, or a runtime that hides the real one).
        from cuzk_supervisor.adapters.machine.cgroupfind import CgroupLocation, CgroupVersion

        version: CgroupVersion = 2 if (s.cgroup_root / "memory.max").exists() else 1
        location = CgroupLocation(version, s.cgroup_root, s.cgroup_root)
        return MemorySampler(proc_root=s.proc_root, cgroup=location, discover=False)
    return MemorySampler(proc_root=s.proc_root)


def host_gpu_probe(s: Settings) -> GpuProbe:
    """The probe ``gpu_probe`` names, with no simulated machine behind it."""
    if s.gpu_probe == "nvml":
        return NvmlProbe()
    if s.gpu_probe == "sim":
        return SimStatusProbe(f"http://{s.daemon_status_listen}/status")
    return StaticProbe(())


def bench_policy(s: Settings) -> BenchPolicy:
    return BenchPolicy(
        max_proofs=s.bench_count,
        concurrency=s.bench_concurrency,
        safety=s.bench_safety,
        min_proofs=s.bench_min_proofs,
    )
