"""Each lifecycle component's own settings: a small frozen value, its fields named as the
settings that give them (``settings.policies.policy`` makes it), so what a component reads is
visible at its door and none of them holds the whole ``Settings``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PhaseSettings:
    """The phase machine's (``machine.Lifecycle`` and its ends)."""

    params_expected: tuple[str, ...]
    params_fetch_command: str
    workers: int
    plan_memory_scale: float
    warmup_budget_s: float
    restart_after_warmup: bool
    proof_budget_s: float
    rate_time_scale: float
    bench_status_sample_s: float
    exit_after_run: bool


@dataclass(frozen=True)
class ReporterSettings:
    """The reporter's and its kill look-ups' (``reporting``, ``killlookup``)."""

    running_ping_interval_s: float
    manager_retry_s: float
    manager_jitter: float
    bench_budget_s: float
    manager_connect_timeout_s: float
    manager_read_timeout_s: float
    manager_status_read_s: float
    manager_status_lookup_s: float


@dataclass(frozen=True)
class MonitorSettings:
    """The status reports' and the memory reaction's (``monitors``)."""

    status_interval_s: float
    manager_jitter: float
    plan_memory_scale: float
    rate_time_scale: float
    proactive_oom: bool


@dataclass(frozen=True)
class FetchSettings:
    """The parameter fetch's (``machineio.ParamsFetch``)."""

    daemon_param_cache: Path
    params_timeout_s: float
    params_progress_interval_s: float
    params_lock_wait_s: float
    state_dir: Path
