"""The policy values the settings make, each mapping declared once.

Modules keep their own small frozen values (``MemoryPolicy``, ``RestartPolicy``,
``ProvingTimeouts``, ``DaemonSettings`` …) so they can be used and tested alone, and none of them
knows ``Settings``. ``FROM_SETTINGS`` says, once for each, which setting gives which of its fields
(or, for the lifecycle's components, ``NAMED_ALIKE``: each field is named as its setting);
``policy(cls, s)`` makes one (a field it does not name keeps the value's own default, ``given``
fills fields no setting gives); ``keeper_recipe`` the daemon's keepers'. The composition root
(``cuzk_supervisor.compose``) and the commands that need one value (``plan``, ``daemon``,
``doctor``, ``prove``) make them here.

A value is named by its class name, not imported: ``ProvingTimeouts`` loads gRPC, and ``plan``
never proves. ``tests/test_settings_policies.py`` checks every name on both sides and that every
mapped field has the type of its setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from cuzk_supervisor.settings.fields import Settings

if TYPE_CHECKING:
    from cuzk_supervisor.daemon.keepers import KeeperRecipe
    from cuzk_supervisor.daemon.spec import DaemonSettings

T = TypeVar("T")

FROM_SETTINGS: Final[Mapping[str, Mapping[str, str]]] = {
    # value class: {its field: the setting that gives it}
    "MemoryPolicy": {
        "safety_margin_fraction": "memory_margin_fraction",
        "safety_margin_min_gib": "memory_margin_min_gib",
        "base_gib": "memory_base_gib",
        "per_worker_gib": "memory_per_worker_gib",
        "max_workers": "max_workers",
        "warmup_workers": "warmup_workers",
    },
    "RiskPolicy": {
        "interval_s": "memory_sample_interval_s",
        "fast_interval_s": "memory_alert_sample_interval_s",
    },
    "RestartPolicy": {
        "initial_backoff_s": "restart_backoff_initial_s",
        "max_backoff_s": "restart_backoff_max_s",
        "stable_after_s": "restart_stable_after_s",
        "crash_loop_failures": "crash_loop_failures",
        "crash_loop_window_s": "crash_loop_window_s",
    },
    "BenchPolicy": {
        "max_proofs": "bench_count",
        "concurrency": "bench_concurrency",
        "queue_ahead": "bench_queue_ahead",
        "safety": "bench_safety",
        "min_proofs": "bench_min_proofs",
        "precision": "bench_precision",
        "most_proofs": "bench_max_proofs",
    },
    "ProvingTimeouts": {
        "submit_deadline_s": "submit_deadline_s",
        "await_deadline_s": "await_deadline_s",
        "proof_budget_s": "proof_budget_s",
        "startup_deadline_s": "daemon_startup_deadline_s",
    },
    "ManagerTimeouts": {
        "connect_s": "manager_connect_timeout_s",
        "read_s": "manager_read_timeout_s",
    },
    "ManagerRetry": {
        "backoff_base_s": "manager_backoff_initial_s",
        "backoff_max_s": "manager_backoff_max_s",
        "report_stop_s": "manager_retry_s",
        "retry_after_max_s": "manager_retry_after_max_s",
    },
    "ShipperSettings": {
        "max_buffer_lines": "log_buffer_lines",
        "bytes_per_min": "log_budget_bytes_per_min",
        "run_bytes_per_min": "log_run_budget_bytes_per_min",
        "run_interval_s": "log_push_interval_s",
        "interval_s": "log_push_early_interval_s",
        "jitter": "manager_jitter",
    },
    "HealthPolicy": {
        "gpu_lost_s": "health_gpu_lost_s",
        "failing_proofs": "health_failing_proofs",
        "failing_s": "health_failing_s",
        "stuck_factor": "health_stuck_factor",
        "stuck_min_s": "health_stuck_min_s",
        "throttle_ratio": "health_throttle_ratio",
        "throttle_s": "health_throttle_s",
        "daemon_exits": "health_daemon_exits",
        "exit_window_s": "health_exit_window_s",
    },
    "LadderPolicy": {
        "top": "health_ladder",
        "restart_limit": "health_restart_limit",
        "restart_window_s": "health_restart_window_s",
    },
    "DaemonSettings": {
        "binary": "daemon_binary",
        "extra_args": "daemon_args",
        "base_config": "daemon_base_config",
        "log_max_bytes": "daemon_log_max_bytes",
        "log_backups": "daemon_log_backups",
        "startup_deadline_s": "daemon_startup_deadline_s",
        "stop_grace_s": "daemon_stop_grace_s",
        "liveness_interval_s": "daemon_liveness_interval_s",
        "liveness_timeout_s": "daemon_liveness_timeout_s",
        "liveness_failures": "daemon_liveness_failures",
    },
}


NAMED_ALIKE: Final[frozenset[str]] = frozenset(
    {"PhaseSettings", "ReporterSettings", "MonitorSettings", "FetchSettings"}
)
"""Values whose every field is named as the setting that gives it (``lifecycle.values``)."""


def policy(cls: type[T], s: Settings, **given: Any) -> T:
    """``cls`` made from the settings ``FROM_SETTINGS`` or ``NAMED_ALIKE`` names, and ``given``."""
    names: Mapping[str, str] = FROM_SETTINGS.get(cls.__name__, {})
    if cls.__name__ in NAMED_ALIKE:
        names = {f.name: f.name for f in fields(cls) if f.name not in given}  # type: ignore[arg-type]
    return cls(**{field: getattr(s, name) for field, name in names.items()}, **given)


def daemon_listen(s: Settings) -> str:
    """Where the daemon listens: ``daemon_listen``, else a unix socket in ``run_dir``."""
    return s.daemon_listen or f"unix://{(s.run_dir / 'cuzk.sock').resolve()}"


def daemon_settings(s: Settings, cgroup_dir: Path | None) -> DaemonSettings:
    """How to run the daemon: its settings, its files in ``run_dir`` and ``log_dir``, and the
    cgroup folder the memory sampler found (its OOM kills are read there)."""
    from cuzk_supervisor.daemon.spec import DaemonSettings

    return policy(
        DaemonSettings, s,
        config_path=s.run_dir / "cuzk.toml",
        log_path=s.log_dir / "cuzk.log",
        cgroup_dir=cgroup_dir,
    )  # fmt: skip


def keeper_recipe(s: Settings, cgroup_dir: Path | None) -> KeeperRecipe:
    """What the daemon's keepers are built from (``daemon.keepers``): how to run it, its restart
    policy, its config's addresses, cache and log level, the worker commands."""
    from cuzk_supervisor.core.restart import RestartPolicy
    from cuzk_supervisor.daemon.keepers import KeeperRecipe

    return KeeperRecipe(
        spec=daemon_settings(s, cgroup_dir), restart=policy(RestartPolicy, s),
        listen=daemon_listen(s), status_listen=s.daemon_status_listen,
        param_cache=s.daemon_param_cache, log_level=s.daemon_log_level,
        worker_commands=s.worker_commands, pid_dir=s.state_dir,
    )  # fmt: skip
