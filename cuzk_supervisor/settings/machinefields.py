"""The settings of the machine: how the daemon is supervised, memory, the plan and the GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.settings.declare import DAY_S, HOUR_S, setting


@dataclass(frozen=True)
class MachineFields:
    # --- supervision --------------------------------------------------------------------------
    daemon_startup_deadline_s: float = setting(
        900.0, "time the daemon may take to answer GetStatus (the SRS load comes first)",
        minimum=1, maximum=DAY_S, group="supervision",
    )  # fmt: skip
    daemon_stop_grace_s: float = setting(
        10.0, "seconds between SIGTERM and SIGKILL", minimum=0, maximum=HOUR_S, group="supervision"
    )
    daemon_liveness_interval_s: float = setting(
        30.0, "GetStatus liveness probe cadence once ready (the daemon runs nvidia-smi for each)",
        minimum=0.1, maximum=HOUR_S, group="supervision",
    )  # fmt: skip
    daemon_liveness_timeout_s: float = setting(
        20.0, "deadline of one liveness probe", minimum=0.1, maximum=HOUR_S, group="supervision"
    )
    daemon_liveness_failures: int = setting(
        3, "missed probes in a row before a hung daemon is killed and restarted", minimum=1,
        maximum=1000, group="supervision",
    )  # fmt: skip
    restart_backoff_initial_s: float = setting(
        1.0, "first restart delay", minimum=0.01, maximum=HOUR_S, group="supervision"
    )
    restart_backoff_max_s: float = setting(
        60.0, "restart delay cap", minimum=0.01, maximum=DAY_S, group="supervision"
    )
    restart_stable_after_s: float = setting(
        600.0, "healthy this long resets the backoff", minimum=1, maximum=DAY_S, group="supervision"
    )
    crash_loop_failures: int = setting(
        5, "failures within the window that mean a crash loop", minimum=1, maximum=1000,
        group="supervision",
    )  # fmt: skip
    crash_loop_window_s: float = setting(
        300.0, "crash-loop window", minimum=1, maximum=DAY_S, group="supervision"
    )
    proactive_oom: bool = setting(
        True, "stop and step down before the kernel's OOM killer acts", group="supervision"
    )
    memory_sample_interval_s: float = setting(
        1.0, "seconds between memory samples while memory is ok (shorter than a proof's climb)",
        minimum=0.01, maximum=60, group="supervision",
    )  # fmt: skip
    memory_alert_sample_interval_s: float = setting(
        0.1, "seconds between memory samples while memory is at warn or critical",
        minimum=0.01, maximum=60, group="supervision",
    )  # fmt: skip

    # --- memory and plan ----------------------------------------------------------------------
    workers: int = setting(
        0, "partition_workers; 0: planned from memory", minimum=0, maximum=256, group="memory"
    )
    max_workers: int = setting(
        12, "most workers planned (more is slower)", minimum=1, maximum=256, group="memory"
    )
    warmup_workers: int = setting(
        2, "workers for the warmup proof", minimum=1, maximum=256, group="memory"
    )
    memory_base_gib: float = setting(
        69.0, "daemon RSS with SRS and PCE loaded", minimum=0, maximum=65_536, group="memory"
    )
    memory_per_worker_gib: float = setting(
        20.0, "peak RSS added by each partition worker", minimum=1, maximum=4096, group="memory"
    )
    memory_margin_fraction: float = setting(
        0.25, "share of the memory limit kept free (the rule's error at high worker counts)",
        minimum=0, maximum=0.9, group="memory",
    )  # fmt: skip
    memory_margin_min_gib: float = setting(
        4.0, "least memory kept free below the limit", minimum=0, maximum=65_536, group="memory"
    )
    plan_memory_scale: float = setting(
        1.0, "planned bytes per measured byte (1024 against the simulator's 1 MiB per GiB)",
        minimum=0.001, maximum=1_000_000, group="memory",
    )  # fmt: skip
    proc_root: Path = setting(
        Path("/proc"), "procfs root (tests point it at fixtures)", group="memory"
    )
    cgroup_root: Path | None = setting(
        None, "cgroup mount root; empty: found in /proc/self/mountinfo", group="memory"
    )
    gpu_probe: str = setting(
        "nvml", "GPU memory source", choices=("nvml", "sim", "none"), group="memory"
    )
