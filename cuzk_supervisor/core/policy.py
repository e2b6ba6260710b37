"""Pure decisions (DESIGN.md principle 1): plain data in, plain data out.

No I/O, no clocks and no randomness in here: the time (a monotonic clock reading, in seconds) and
any random draw are arguments, so every function can be tested exhaustively without processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# =================================================================================================
# Restart policy: how long to wait before restarting a failed daemon, and when to stop trying.
#
# The shape follows the kubelet's crash-loop backoff (exponential, capped, reset after a stable
# run) with tenacity's habit of making the strategy a printable, comparable value. A crash loop
# (too many failures too close together) is a verdict, not a longer sleep: the caller reports it.
# =================================================================================================


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"RestartPolicy.{name} must be {rule}, got {value!r}")


def _is_number(value: object) -> bool:
    # bool is an int subclass; True seconds or True failures is always a mistake.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart the daemon after a failure; a value you can print, compare and log.

    The delay before the n-th consecutive restart (n = 1, 2, ...) is, before jitter,
    ``min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))``. Jitter only ever shortens
    it: the delay is drawn from ``(base * (1 - jitter), base]``, so ``jitter=1.0`` is "full
    jitter" and the cap is never exceeded. After ``stable_after_s`` of health the count starts
    over. ``crash_loop_failures`` failures within ``crash_loop_window_s`` mean give up.
    """

    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2
    stable_after_s: float = 600.0
    crash_loop_failures: int = 5
    crash_loop_window_s: float = 300.0

    def __post_init__(self) -> None:
        for name in (
            "initial_backoff_s",
            "max_backoff_s",
            "multiplier",
            "jitter",
            "stable_after_s",
            "crash_loop_window_s",
        ):
            value = getattr(self, name)
            _check(_is_number(value), name, value, "a finite number")
        _check(self.initial_backoff_s > 0, "initial_backoff_s", self.initial_backoff_s, "> 0")
        _check(
            self.max_backoff_s >= self.initial_backoff_s,
            "max_backoff_s",
            self.max_backoff_s,
            f">= initial_backoff_s ({self.initial_backoff_s})",
        )
        # Below 1 the curve would shrink with every failure.
        _check(self.multiplier >= 1, "multiplier", self.multiplier, ">= 1")
        _check(0 <= self.jitter <= 1, "jitter", self.jitter, "between 0 and 1")
        _check(self.stable_after_s > 0, "stable_after_s", self.stable_after_s, "> 0")
        _check(
            isinstance(self.crash_loop_failures, int)
            and not isinstance(self.crash_loop_failures, bool)
            and self.crash_loop_failures >= 1,
            "crash_loop_failures",
            self.crash_loop_failures,
            "an integer >= 1",
        )
        _check(self.crash_loop_window_s > 0, "crash_loop_window_s", self.crash_loop_window_s, "> 0")


@dataclass(frozen=True)
class Failure:
    """One daemon failure: when (monotonic seconds) and why (the classified exit reason)."""

    at: float
    reason: str


@dataclass(frozen=True)
class RestartHistory:
    """What the restart policy remembers; start from ``RestartHistory()``.

    ``failures``: the recent failures since the last reset, oldest first; only those that can
    still count towards a crash loop are kept (at most ``crash_loop_failures``, within the
    window), so the value stays small however long the supervisor runs.
    ``attempt``: consecutive failures since the last reset (the backoff exponent).
    ``healthy_since``: when the daemon last became healthy; None while it is not.
    """

    failures: tuple[Failure, ...] = ()
    attempt: int = 0
    healthy_since: float | None = None


@dataclass(frozen=True)
class Restart:
    """Restart after ``delay_s``; this is consecutive restart number ``attempt`` (from 1)."""

    delay_s: float
    attempt: int
    reason: str  # the last failure's reason ("" if none was recorded since the last reset)


@dataclass(frozen=True)
class GiveUp:
    """Crash loop: ``failures`` failures within ``window_s``; ``reason`` is the last one's."""

    reason: str
    failures: int
    window_s: float

    def describe(self) -> str:
        return (
            f"crash loop: {self.failures} failures within {self.window_s:g} s (last: {self.reason})"
        )


RestartDecision = Restart | GiveUp


def backoff_s(policy: RestartPolicy, attempt: int) -> float:
    """The un-jittered delay before restart number ``attempt`` (1-based)."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    try:
        raw = policy.initial_backoff_s * float(policy.multiplier) ** (attempt - 1)
    except OverflowError:  # far past the cap anyway
        return policy.max_backoff_s
    return min(policy.max_backoff_s, raw)


def jittered_backoff_s(policy: RestartPolicy, attempt: int, rand: float) -> float:
    """``backoff_s`` shortened by up to ``jitter`` of itself; ``rand`` is a draw from [0, 1)."""
    _check_rand(rand)
    return backoff_s(policy, attempt) * (1.0 - policy.jitter * rand)


def record_failure(
    policy: RestartPolicy, history: RestartHistory, now: float, reason: str
) -> RestartHistory:
    """The history after the daemon failed at ``now`` for ``reason``.

    The policy is needed here (not only in ``next_restart``) so the history can forget what no
    longer matters: a stable run before this failure resets the count, and failures outside the
    crash-loop window are dropped.
    """
    _check_time(history, now)
    if _stable(policy, history, now):
        history = RestartHistory()
    kept = tuple(f for f in history.failures if now - f.at <= policy.crash_loop_window_s)
    failures = (*kept, Failure(at=now, reason=reason))[-policy.crash_loop_failures :]
    return RestartHistory(failures=failures, attempt=history.attempt + 1, healthy_since=None)


def record_healthy(history: RestartHistory, now: float) -> RestartHistory:
    """The history after the daemon was seen healthy at ``now`` (idempotent while healthy)."""
    _check_time(history, now)
    if history.healthy_since is not None:
        return history  # healthy since the earlier time; repeated probes do not restart the clock
    return RestartHistory(history.failures, history.attempt, healthy_since=now)


def next_restart(
    policy: RestartPolicy, history: RestartHistory, now: float, rand: float
) -> RestartDecision:
    """Restart (after how long) or give up, given the history at ``now``.

    ``rand`` is a uniform draw from [0, 1) supplied by the caller (``random.random()``), which
    keeps this function pure. Called after ``record_failure``; called while the daemon has been
    healthy for the stable period (a restart for another reason) it answers the initial delay.
    """
    _check_time(history, now)
    _check_rand(rand)
    if _stable(policy, history, now):
        history = RestartHistory()
    recent = [f for f in history.failures if now - f.at <= policy.crash_loop_window_s]
    if len(recent) >= policy.crash_loop_failures:
        return GiveUp(
            reason=recent[-1].reason, failures=len(recent), window_s=policy.crash_loop_window_s
        )
    attempt = max(1, history.attempt)
    reason = history.failures[-1].reason if history.failures else ""
    return Restart(
        delay_s=jittered_backoff_s(policy, attempt, rand), attempt=attempt, reason=reason
    )


def _stable(policy: RestartPolicy, history: RestartHistory, now: float) -> bool:
    return (
        history.healthy_since is not None and now - history.healthy_since >= policy.stable_after_s
    )


def _check_time(history: RestartHistory, now: float) -> None:
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite clock reading, got {now!r}")
    times = [f.at for f in history.failures[-1:]]
    if history.healthy_since is not None:
        times.append(history.healthy_since)
    if times and now < max(times):
        raise ValueError(f"now ({now}) is before the history ({max(times)}): use a monotonic clock")


def _check_rand(rand: float) -> None:
    if not 0.0 <= rand < 1.0:
        raise ValueError(f"rand must be a draw from [0, 1), got {rand!r}")


# =================================================================================================
# Shared by the memory sections below: validation in the style of the restart policy (a
# ValueError naming the class and field) and GiB formatting for reasons that people read.
# =================================================================================================

GIB = 1 << 30
MIB = 1 << 20


def _require(owner: str, ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{owner}.{name} must be {rule}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _gib_to_bytes(gib: float) -> int:
    # Round up: a figure is a need, and a need rounded down could plan one worker too many.
    return math.ceil(gib * GIB)


def _fmt_bytes(n_bytes: float) -> str:
    """GiB as ``_fmt_gib``, MiB below 1 GiB (rates, and the simulator's small real sizes)."""
    if abs(n_bytes) >= GIB:
        return _fmt_gib(n_bytes)
    return f"{n_bytes / MIB:.1f} MiB"


def _fmt_gib(n_bytes: float) -> str:
    """``"256 GiB"`` for (nearly) whole GiB, else one decimal (off by at most 0.05 GiB)."""
    value = n_bytes / GIB
    if abs(value - round(value)) < 0.05:
        return f"{round(value)} GiB"
    return f"{value:.1f} GiB"


# =================================================================================================
# Memory plan: how many partition workers fit in the effective memory limit, and the daemon
# config values that follow (incident I4; figures from reference/cuzk.md §2 and §3).
#
# Peak RSS follows the rule of thumb ``base + per_worker × W`` (69 + 20 × W GiB). The limit is
# the lower of host RAM and the cgroup limit (the container is not the host, DESIGN.md
# principle 8), less a safety margin. Every number carries the reason it has, so the plan can be
# printed as a table, logged as JSON and sent with the bench rate (incident I6).
# =================================================================================================


@dataclass(frozen=True)
class MemoryPolicy:
    """The figures a worker plan is made from; all sizes in GiB.

    Safety margin: ``max(safety_margin_fraction × bound, safety_margin_min_gib)`` where the bound
    is ``min(host, cgroup)``. The default 25 % is not a guess about other processes: it is the
    measured error of the rule of thumb. At 12 workers cuzk.md §3 measured a peak of 373–400 GiB
    where ``69 + 20 × 12`` says 309 GiB (up to 91 GiB, 23 % of 400, more), and a 125 GB machine
    was OOM-killed at the rule's 2 workers (incident I4). With 25 % the plan for 128, 256, 384
    and 512 GiB hosts is 1, 6, 10, 12 workers: the published 2, 7, 10, 12 or one fewer, never
    more. A 5 % (or 13 GiB) margin would plan 8 on 256 GiB and 12 on 384 GiB, more than
    published; no linear rule with any margin fraction reproduces 2, 7, 10, 12 exactly, and with
    69 + 20 × W only fractions in (24.7 %, 26.2 %] give "published or one fewer" on all four.
    """

    safety_margin_fraction: float = 0.25
    safety_margin_min_gib: float = 4.0
    base_gib: float = 69.0
    """Idle RSS with the PoRep SRS (≈ 44 GiB) and PCE (≈ 26 GiB) resident: measured 69 GiB."""
    per_worker_gib: float = 20.0
    """Peak RSS added per partition worker (rule of thumb, workers release)."""
    max_workers: int = 12
    """More partition workers than this is no faster (memory bandwidth, cuzk.md §3)."""
    warmup_workers: int = 2
    """Workers for the warmup proof, which builds the PCE cache (slow; keep it small)."""
    gpu_vram_need_gib: float = 12.0
    """VRAM a GPU needs to prove (≈ 12 GiB per GPU)."""
    budget_partition_gib: float = 14.0
    """What the budget release reserves per PoRep partition."""
    srs_gib: float = 44.0
    """PoRep 32G SRS resident, for ``total_budget``."""
    pce_gib: float = 26.0
    """PoRep PCE in memory, for ``total_budget``."""
    step_down_by: int = 1
    """Workers removed by each step down after an OOM kill or a critical memory event."""

    def __post_init__(self) -> None:
        owner = "MemoryPolicy"
        for name in (
            "safety_margin_fraction",
            "safety_margin_min_gib",
            "base_gib",
            "per_worker_gib",
            "gpu_vram_need_gib",
            "budget_partition_gib",
            "srs_gib",
            "pce_gib",
        ):
            value = getattr(self, name)
            _require(owner, _is_number(value), name, value, "a finite number")
        # A fraction of 1 would leave nothing to plan with, whatever the host.
        _require(
            owner,
            0 <= self.safety_margin_fraction < 1,
            "safety_margin_fraction",
            self.safety_margin_fraction,
            "in [0, 1)",
        )
        for name in (
            "safety_margin_min_gib",
            "base_gib",
            "gpu_vram_need_gib",
            "srs_gib",
            "pce_gib",
        ):
            _require(owner, getattr(self, name) >= 0, name, getattr(self, name), ">= 0")
        # Zero per worker would make every host fit any number of workers.
        for name in ("per_worker_gib", "budget_partition_gib"):
            _require(owner, getattr(self, name) > 0, name, getattr(self, name), "> 0")
        for name in ("max_workers", "warmup_workers", "step_down_by"):
            value = getattr(self, name)
            _require(owner, _is_int(value) and value >= 1, name, value, "an integer >= 1")

    def margin_bytes(self, bound_bytes: int) -> int:
        """The safety margin for a limit of ``bound_bytes`` (the lower of host and cgroup)."""
        return max(
            math.ceil(bound_bytes * self.safety_margin_fraction),
            _gib_to_bytes(self.safety_margin_min_gib),
        )


@dataclass(frozen=True)
class EffectiveLimit:
    """What a plan may use: ``min(host, cgroup) − margin`` (never below 0), and why."""

    limit_bytes: int
    host_bytes: int
    cgroup_bytes: int | None
    margin_bytes: int
    bound_by: str
    """``"host"`` or ``"cgroup"``: which of the two was lower (the host on a tie)."""

    @property
    def bound_bytes(self) -> int:
        """The hard limit where the kernel acts: the lower of host RAM and the cgroup limit."""
        return self.host_bytes if self.bound_by == "host" else int(self.cgroup_bytes or 0)

    @property
    def formula(self) -> str:
        cgroup = (
            "no cgroup" if self.cgroup_bytes is None else f"cgroup {_fmt_gib(self.cgroup_bytes)}"
        )
        host = _fmt_gib(self.host_bytes)
        return f"min(host {host}, {cgroup}) − margin {_fmt_gib(self.margin_bytes)}"

    @property
    def reason(self) -> str:
        text = f"{self.formula} = {_fmt_gib(self.limit_bytes)}"
        if self.limit_bytes == 0:
            return f"{text} (the margin is larger than the limit)"
        if self.cgroup_bytes is None:
            return f"{text}: no cgroup limit, the host's RAM binds"
        return f"{text}: the {self.bound_by} binds"

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit_bytes": self.limit_bytes,
            "host_bytes": self.host_bytes,
            "cgroup_bytes": self.cgroup_bytes,
            "margin_bytes": self.margin_bytes,
            "bound_by": self.bound_by,
            "bound_bytes": self.bound_bytes,
            "reason": self.reason,
        }


def effective_limit(
    host_total_bytes: int, cgroup_limit_bytes: int | None, safety_margin_bytes: int
) -> EffectiveLimit:
    """``min(host, cgroup) − margin``, floored at 0, with which one bound it.

    A cgroup limit at or above the host's RAM (cgroup v1 reports "unlimited" as a huge number)
    does not bind; ``None`` means no cgroup limit was found.
    """
    _require(
        "effective_limit",
        _is_int(host_total_bytes) and host_total_bytes > 0,
        "host_total_bytes",
        host_total_bytes,
        "an integer > 0",
    )
    _require(
        "effective_limit",
        cgroup_limit_bytes is None or (_is_int(cgroup_limit_bytes) and cgroup_limit_bytes > 0),
        "cgroup_limit_bytes",
        cgroup_limit_bytes,
        "None or an integer > 0",
    )
    _require(
        "effective_limit",
        _is_int(safety_margin_bytes) and safety_margin_bytes >= 0,
        "safety_margin_bytes",
        safety_margin_bytes,
        "an integer >= 0",
    )
    if cgroup_limit_bytes is not None and cgroup_limit_bytes < host_total_bytes:
        bound, bound_by = cgroup_limit_bytes, "cgroup"
    else:
        bound, bound_by = host_total_bytes, "host"
    return EffectiveLimit(
        limit_bytes=max(0, bound - safety_margin_bytes),
        host_bytes=host_total_bytes,
        cgroup_bytes=cgroup_limit_bytes,
        margin_bytes=safety_margin_bytes,
        bound_by=bound_by,
    )


def sim_memory_scale(mib_per_simulated_gib: float) -> float:
    """``PlanInputs.memory_scale`` for a simulator run with ``--memory-scale m``.

    The simulator allocates ``m`` real MiB per simulated GiB, so one real byte stands for
    ``1024 / m`` simulated bytes.
    """
    _require(
        "sim_memory_scale",
        _is_number(mib_per_simulated_gib) and mib_per_simulated_gib > 0,
        "mib_per_simulated_gib",
        mib_per_simulated_gib,
        "a finite number > 0",
    )
    return GIB / (mib_per_simulated_gib * MIB)


@dataclass(frozen=True)
class PlanInputs:
    """What the plan is made from: measured memory and GPUs, and an optional operator override.

    ``memory_scale`` is planning bytes per measured byte: 1 on real hardware. Against the
    simulator use ``sim_memory_scale(m)``: the measured host and cgroup bytes are then planned as
    simulated bytes, so the figures (69 + 20 × W GiB) and the plan's ``total_budget_gib`` are in
    the simulated GiB the simulator reads from its config. VRAM is never scaled (the simulator
    does not allocate it).
    """

    host_total_bytes: int
    cgroup_limit_bytes: int | None = None
    gpu_vram_total_bytes: tuple[int, ...] = ()
    """One entry per GPU: its total VRAM. Empty: no GPU seen (plan from RAM only)."""
    workers_override: int | None = None
    """The operator's worker count: replaces the computed one, with notes when it does not fit."""
    memory_scale: float = 1.0

    def __post_init__(self) -> None:
        owner = "PlanInputs"
        # A list from a caller would make the frozen value unhashable; keep it a tuple.
        object.__setattr__(self, "gpu_vram_total_bytes", tuple(self.gpu_vram_total_bytes))
        _require(
            owner,
            _is_int(self.host_total_bytes) and self.host_total_bytes > 0,
            "host_total_bytes",
            self.host_total_bytes,
            "an integer > 0",
        )
        _require(
            owner,
            self.cgroup_limit_bytes is None
            or (_is_int(self.cgroup_limit_bytes) and self.cgroup_limit_bytes > 0),
            "cgroup_limit_bytes",
            self.cgroup_limit_bytes,
            "None or an integer > 0",
        )
        _require(
            owner,
            all(_is_int(v) and v >= 0 for v in self.gpu_vram_total_bytes),
            "gpu_vram_total_bytes",
            self.gpu_vram_total_bytes,
            "integers >= 0",
        )
        _require(
            owner,
            self.workers_override is None
            or (_is_int(self.workers_override) and self.workers_override >= 1),
            "workers_override",
            self.workers_override,
            "None or an integer >= 1",
        )
        _require(
            owner,
            _is_number(self.memory_scale) and self.memory_scale > 0,
            "memory_scale",
            self.memory_scale,
            "a finite number > 0",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_total_bytes": self.host_total_bytes,
            "cgroup_limit_bytes": self.cgroup_limit_bytes,
            "gpu_vram_total_bytes": list(self.gpu_vram_total_bytes),
            "workers_override": self.workers_override,
            "memory_scale": self.memory_scale,
        }


@dataclass(frozen=True)
class WorkerPlan:
    """How many partition workers, the daemon config values that follow, and why.

    ``partition_workers`` and ``max_parallel_synthesis`` are always ``full_workers`` (both
    releases obey the same number), so they are derived, not stored. ``reasons`` maps each number
    to the sentence that explains it; ``notes`` are warnings worth showing (a small GPU, an
    override that does not fit, a scaled plan); ``step_downs`` are the causes of each step down.
    """

    inputs: PlanInputs
    limit: EffectiveLimit
    rule: str
    full_workers: int
    warmup_workers: int
    total_budget_gib: int
    reasons: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    step_downs: tuple[str, ...] = ()

    @property
    def partition_workers(self) -> int:
        return self.full_workers

    @property
    def max_parallel_synthesis(self) -> int:
        return self.full_workers

    @property
    def gpu_count(self) -> int:
        return len(self.inputs.gpu_vram_total_bytes)

    @property
    def gpu_vram_total_bytes(self) -> tuple[int, ...]:
        return self.inputs.gpu_vram_total_bytes

    def reason(self, name: str) -> str:
        return dict(self.reasons)[name]

    def summary(self) -> str:
        """One line for a log: the numbers and the reason for the worker count."""
        return (
            f"{self.full_workers} partition workers (warmup {self.warmup_workers}), "
            f"total_budget {self.total_budget_gib}GiB, {self.gpu_count} GPU(s): "
            f"{self.reason('full_workers')}"
        )

    def config_values(self) -> dict[str, int]:
        """The plan's part of ``DaemonConfigValues``: ``DaemonConfigValues(**plan.config_values(),
        listen=...)``. (Kept as a dict so this module imports nothing that does I/O.)"""
        return {
            "partition_workers": self.partition_workers,
            "total_budget_gib": self.total_budget_gib,
            "max_parallel_synthesis": self.max_parallel_synthesis,
        }

    def rows(self) -> tuple[tuple[str, str, str], ...]:
        """(name, value, reason) for a table, in the order a person reads them."""
        values: dict[str, object] = {
            "effective_limit": _fmt_gib(self.limit.limit_bytes),
            "full_workers": self.full_workers,
            "warmup_workers": self.warmup_workers,
            "partition_workers": self.partition_workers,
            "total_budget": f"{self.total_budget_gib}GiB",
            "max_parallel_synthesis": self.max_parallel_synthesis,
            "gpus": self.gpu_count,
        }
        return tuple((name, str(values[name]), self.reason(name)) for name in values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "full_workers": self.full_workers,
            "warmup_workers": self.warmup_workers,
            **self.config_values(),
            "gpu_count": self.gpu_count,
            "gpu_vram_total_bytes": list(self.gpu_vram_total_bytes),
            "rule": self.rule,
            "limit": self.limit.to_dict(),
            "inputs": self.inputs.to_dict(),
            "reasons": dict(self.reasons),
            "notes": list(self.notes),
            "step_downs": list(self.step_downs),
        }


@dataclass(frozen=True)
class PlanRefusal:
    """No plan: less than one worker fits, or no GPU has enough VRAM. ``reasons`` says each."""

    inputs: PlanInputs
    limit: EffectiveLimit
    reasons: tuple[str, ...]
    shortfall_bytes: int | None = None
    """Memory missing for one worker; None when memory was not the problem."""

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "refused": True,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "shortfall_bytes": self.shortfall_bytes,
            "limit": self.limit.to_dict(),
            "inputs": self.inputs.to_dict(),
        }


@dataclass(frozen=True)
class GiveUpOOM:
    """Out of memory at one worker: nothing left to step down to. ``reason`` names the cause."""

    reason: str
    cause: str
    step_downs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "give_up": True,
            "reason": self.reason,
            "cause": self.cause,
            "step_downs": list(self.step_downs),
        }


_BUDGET_CUT_NOTE = "total_budget "


def _fits(limit: EffectiveLimit, policy: MemoryPolicy) -> int:
    """The most workers whose peak ``base + per_worker × W`` fits the limit (0 if none)."""
    spare = limit.limit_bytes - _gib_to_bytes(policy.base_gib)
    return max(0, spare // _gib_to_bytes(policy.per_worker_gib))


def total_budget_gib(workers: int, limit: EffectiveLimit, policy: MemoryPolicy) -> int:
    """The daemon's ``total_budget`` for ``workers`` (e.g. the warmup's, below the plan's)."""
    return _budget(workers, limit, policy)[0]


def _budget(workers: int, limit: EffectiveLimit, policy: MemoryPolicy) -> tuple[int, str, bool]:
    """``total_budget`` in whole GiB, its reason, and whether the limit cut it below the need."""
    need_gib = math.ceil(policy.srs_gib + policy.pce_gib + workers * policy.budget_partition_gib)
    cap_gib = limit.limit_bytes // GIB
    budget = max(1, min(need_gib, cap_gib))  # the daemon config needs >= 1
    formula = (
        f"SRS {policy.srs_gib:g} + PCE {policy.pce_gib:g} + {workers} × "
        f"{policy.budget_partition_gib:g} GiB per partition = {need_gib} GiB"
    )
    if budget >= need_gib:
        return budget, f"{formula} (budget release), within the effective limit", False
    return (
        budget,
        f"{formula}, cut to {budget} GiB so it never exceeds the effective limit "
        f"{_fmt_gib(limit.limit_bytes)}: the budget release will run fewer partitions at once",
        True,
    )


def _build_plan(
    inputs: PlanInputs,
    limit: EffectiveLimit,
    rule: str,
    workers: int,
    workers_reason: str,
    policy: MemoryPolicy,
    notes: tuple[str, ...],
    step_downs: tuple[str, ...] = (),
) -> WorkerPlan:
    """A plan for ``workers`` with every derived number (and its reason) computed from it."""
    warmup = min(policy.warmup_workers, workers)
    budget, budget_reason, cut = _budget(workers, limit, policy)
    # The budget note describes this W only: drop one carried over from before a step down.
    notes = tuple(n for n in notes if not n.startswith(_BUDGET_CUT_NOTE))
    if cut:
        notes = (*notes, f"{_BUDGET_CUT_NOTE}{budget} GiB is below what {workers} partitions need")
    gpus = inputs.gpu_vram_total_bytes
    reasons = (
        ("effective_limit", limit.reason),
        ("full_workers", workers_reason),
        (
            "warmup_workers",
            f"min(warmup {policy.warmup_workers}, full {workers}): the warmup proof builds the "
            "PCE cache and is slow; fewer workers keep its memory low",
        ),
        ("partition_workers", "= full workers: the workers release synthesizes this many at once"),
        ("total_budget", budget_reason),
        (
            "max_parallel_synthesis",
            "= full workers: caps the budget release at the same concurrency (its default is 18)",
        ),
        (
            "gpus",
            f"{len(gpus)} GPU(s), VRAM {', '.join(_fmt_gib(v) for v in gpus)}"
            if gpus
            else "no GPU seen: planned from RAM only",
        ),
    )
    return WorkerPlan(
        inputs=inputs,
        limit=limit,
        rule=rule,
        full_workers=workers,
        warmup_workers=warmup,
        total_budget_gib=budget,
        reasons=reasons,
        notes=notes,
        step_downs=step_downs,
    )


def plan_workers(inputs: PlanInputs, policy: MemoryPolicy) -> WorkerPlan | PlanRefusal:
    """The worker plan for these inputs, or a refusal that says what is missing.

    ``full_workers`` is the largest W with ``base + per_worker × W ≤ effective limit``, clamped
    to ``[1, max_workers]``; less than one → ``PlanRefusal`` naming the shortfall in GiB. An
    override replaces W (notes say when it does not fit or exceeds the maximum). GPUs below the
    VRAM need are noted; if every GPU is below it, the plan is refused. No GPU at all is allowed
    (sim, doctor on a laptop) and noted.
    """
    scale = inputs.memory_scale
    host = max(1, int(inputs.host_total_bytes * scale))
    cgroup = (
        None
        if inputs.cgroup_limit_bytes is None
        else max(1, int(inputs.cgroup_limit_bytes * scale))
    )
    bound = host if cgroup is None else min(host, cgroup)
    limit = effective_limit(host, cgroup, policy.margin_bytes(bound))
    rule = (
        f"{policy.base_gib:g} + {policy.per_worker_gib:g} × W ≤ {_fmt_gib(limit.limit_bytes)} "
        f"({limit.formula})"
    )
    notes: list[str] = []
    refusals: list[str] = []
    if scale != 1.0:
        notes.append(
            f"planned in scaled bytes: measured memory × {scale:g} (a simulator allocating "
            f"{GIB / scale / MIB:g} MiB per simulated GiB); sizes are simulated GiB"
        )

    need = _gib_to_bytes(policy.gpu_vram_need_gib)
    gpus = inputs.gpu_vram_total_bytes
    small = [(i, v) for i, v in enumerate(gpus) if v < need]
    listing = ", ".join(f"GPU {i}: {_fmt_gib(v)}" for i, v in small)
    if not gpus:
        notes.append(
            "no GPU seen: planned from RAM only (fine for sim or doctor; proving needs one)"
        )
    elif len(small) == len(gpus):
        refusals.append(
            f"no usable GPU: every GPU has less than the {policy.gpu_vram_need_gib:g} GiB VRAM a "
            f"proof needs ({listing})"
        )
    elif small:
        notes.append(
            f"below the {policy.gpu_vram_need_gib:g} GiB VRAM a proof needs, may fail proofs: "
            f"{listing}"
        )

    fit = _fits(limit, policy)
    one = _gib_to_bytes(policy.base_gib + policy.per_worker_gib)
    shortfall = None
    if inputs.workers_override is not None:
        workers = inputs.workers_override
        workers_reason = f"override: {workers} (the rule fits {min(fit, policy.max_workers)})"
        if workers > fit:
            peak = _gib_to_bytes(policy.base_gib + policy.per_worker_gib * workers)
            notes.append(
                f"override {workers} does not fit: peak by the rule {_fmt_gib(peak)} > effective "
                f"limit {_fmt_gib(limit.limit_bytes)}"
            )
        if workers > policy.max_workers:
            notes.append(f"override {workers} exceeds max {policy.max_workers}: more is slower")
    elif fit < 1:
        shortfall = one - limit.limit_bytes
        refusals.insert(
            0,
            f"needs {_fmt_gib(one)} for 1 worker, effective limit {_fmt_gib(limit.limit_bytes)}: "
            f"short by {_fmt_gib(shortfall)} ({limit.formula})",
        )
        workers, workers_reason = 0, ""
    elif fit > policy.max_workers:
        workers = policy.max_workers
        workers_reason = (
            f"{fit} fit by {rule}; clamped to max {policy.max_workers}: more is slower "
            "(memory bandwidth)"
        )
    else:
        workers = fit
        workers_reason = f"largest W with {rule}"

    if refusals:
        return PlanRefusal(
            inputs=inputs, limit=limit, reasons=tuple(refusals), shortfall_bytes=shortfall
        )
    return _build_plan(inputs, limit, rule, workers, workers_reason, policy, tuple(notes))


def step_down(
    plan: WorkerPlan,
    cause: str,
    policy: MemoryPolicy,
    running_workers: int | None = None,
    fitted: int | None = None,
    fitted_reason: str = "",
) -> WorkerPlan | GiveUpOOM:
    """The plan after an OOM kill or a critical memory event: ``step_down_by`` fewer workers
    (at least 1), derived values recomputed, the cause recorded. At 1 worker: ``GiveUpOOM``.

    ``fitted`` is what a measurement says fits (``core.memfit.fit_workers``): then the step goes
    there at once, not one worker at a time (never above ``current - step_down_by``).

    ``running_workers`` is what the daemon ran when memory ran out (the warmup runs fewer than
    the plan): stepping down from the plan's full count would only repeat the same OOM, so the
    step is taken from the lower of the two."""
    history = (*plan.step_downs, cause)
    current = plan.full_workers
    if running_workers is not None:
        current = max(1, min(current, running_workers))
    if current <= 1:
        return GiveUpOOM(
            reason=f"out of memory at 1 partition worker, nothing left to step down to: {cause}",
            cause=cause,
            step_downs=history,
        )
    workers = max(1, current - policy.step_down_by)
    reason = f"stepped down from {current} to {workers} after: {cause}"
    if fitted is not None and fitted < workers:
        workers = max(1, fitted)
        reason = f"stepped down from {current} to {workers} after: {cause}; {fitted_reason}"
    return _build_plan(
        plan.inputs, plan.limit, plan.rule, workers, reason, policy, plan.notes, history
    )


# =================================================================================================
# OOM risk: is memory at risk now, judged from recent samples (incident I4: act before the kernel
# does). Three signals: headroom to the hard limit, PSI ("some" avg10, % of time stalled on
# memory) and the trend (seconds to the limit at the recent least-squares growth rate).
# Hysteresis: a level is entered when a signal crosses its enter threshold and kept until every
# signal is back past its exit threshold, so a value hovering at a threshold does not flap.
# =================================================================================================


class RiskLevel(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def severity(self) -> int:
        """0, 1, 2: compare levels by this (the strings themselves sort alphabetically)."""
        return {"ok": 0, "warn": 1, "critical": 2}[self.value]


@dataclass(frozen=True)
class MemorySample:
    """One reading: when (monotonic seconds), memory in use, and PSI some avg10 if known."""

    t: float
    used_bytes: int
    psi_some_avg10: float | None = None

    def __post_init__(self) -> None:
        owner = "MemorySample"
        _require(owner, _is_number(self.t), "t", self.t, "a finite number")
        _require(
            owner,
            _is_int(self.used_bytes) and self.used_bytes >= 0,
            "used_bytes",
            self.used_bytes,
            "an integer >= 0",
        )
        _require(
            owner,
            self.psi_some_avg10 is None
            or (_is_number(self.psi_some_avg10) and 0 <= self.psi_some_avg10 <= 100),
            "psi_some_avg10",
            self.psi_some_avg10,
            "None or a percentage in [0, 100]",
        )


@dataclass(frozen=True)
class RiskPolicy:
    """Thresholds of the OOM-risk levels; every enter threshold has an exit threshold."""

    warn_enter_headroom: float = 0.15
    """Enter warn when headroom (free fraction of the limit) falls below this."""
    warn_exit_headroom: float = 0.20
    """Leave warn only when headroom is back above this."""
    critical_enter_headroom: float = 0.05
    """Enter critical when headroom falls below this."""
    critical_exit_headroom: float = 0.08
    """Leave critical only when headroom is back above this."""
    warn_enter_seconds_to_limit: float = 30.0
    """Enter warn when the limit is this close at the recent growth rate."""
    warn_exit_seconds_to_limit: float = 60.0
    """Leave warn only when the limit is at least this far away (or memory is not growing)."""
    critical_enter_seconds_to_limit: float = 10.0
    """Enter critical when the limit is this close at the recent growth rate."""
    critical_exit_seconds_to_limit: float = 20.0
    """Leave critical only when the limit is at least this far away (or not growing)."""
    trend_max_headroom: float = 0.25
    """The trend counts only while headroom is below this: partitions allocate in bursts, and a
    burst far from the limit is a normal ramp, not a march to OOM. 1.0 always trusts the trend."""
    trend_window_s: float = 10.0
    """The growth rate is the least-squares slope of the samples within this many seconds."""
    trend_min_samples: int = 3
    """Fewer samples in the window than this: no trend (two points are a spike, not a rate)."""
    psi_warn_enter: float = 10.0
    """Enter warn when PSI some avg10 (% of time stalled on memory) rises above this."""
    psi_warn_exit: float = 5.0
    """Leave warn only when PSI some avg10 is back below this."""
    psi_critical_enter: float = 40.0
    """Enter critical when PSI some avg10 rises above this: the host is reclaiming hard."""
    psi_critical_exit: float = 25.0
    """Leave critical only when PSI some avg10 is back below this."""
    interval_s: float = 1.0
    """Seconds between samples while the level is ok."""
    fast_interval_s: float = 0.1
    """Seconds between samples while the level is warn or critical."""

    def __post_init__(self) -> None:
        owner = "RiskPolicy"
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            _require(owner, _is_number(value), name, value, "a finite number")
        for name in (
            "warn_enter_headroom",
            "warn_exit_headroom",
            "critical_enter_headroom",
            "critical_exit_headroom",
            "trend_max_headroom",
        ):
            _require(owner, 0 <= getattr(self, name) <= 1, name, getattr(self, name), "in [0, 1]")
        for name in ("psi_warn_enter", "psi_warn_exit", "psi_critical_enter", "psi_critical_exit"):
            _require(
                owner, 0 <= getattr(self, name) <= 100, name, getattr(self, name), "in [0, 100]"
            )
        for name in ("trend_window_s", "interval_s", "fast_interval_s"):
            _require(owner, getattr(self, name) > 0, name, getattr(self, name), "> 0")
        for name in (
            "warn_enter_seconds_to_limit",
            "warn_exit_seconds_to_limit",
            "critical_enter_seconds_to_limit",
            "critical_exit_seconds_to_limit",
        ):
            _require(owner, getattr(self, name) >= 0, name, getattr(self, name), ">= 0")
        _require(
            owner,
            _is_int(self.trend_min_samples) and self.trend_min_samples >= 2,
            "trend_min_samples",
            self.trend_min_samples,
            "an integer >= 2",
        )
        # Hysteresis runs the right way: exits are easier to hold than entries to reach, and
        # critical is never easier to enter than warn.
        ordered = (
            ("critical_exit_headroom", "critical_enter_headroom", "<=", 1),
            ("warn_exit_headroom", "warn_enter_headroom", "<=", 1),
            ("warn_enter_headroom", "critical_enter_headroom", "<=", 1),
            ("critical_exit_seconds_to_limit", "critical_enter_seconds_to_limit", "<=", 1),
            ("warn_exit_seconds_to_limit", "warn_enter_seconds_to_limit", "<=", 1),
            ("warn_enter_seconds_to_limit", "critical_enter_seconds_to_limit", "<=", 1),
            ("psi_critical_exit", "psi_critical_enter", ">=", -1),
            ("psi_warn_exit", "psi_warn_enter", ">=", -1),
            ("psi_warn_enter", "psi_critical_enter", ">=", -1),
        )
        for name, other, op, sign in ordered:
            value, bound = getattr(self, name), getattr(self, other)
            _require(owner, sign * (value - bound) >= 0, name, value, f"{op[0]}= {other} ({bound})")


@dataclass(frozen=True)
class RiskAssessment:
    """The level now and the numbers behind it, so the caller can log exactly why."""

    level: RiskLevel
    previous: RiskLevel
    used_bytes: int
    limit_bytes: int
    headroom_bytes: int
    headroom_fraction: float
    slope_bytes_per_s: float | None
    """Least-squares growth rate over the trend window; None with too few samples."""
    seconds_to_limit: float | None
    """At that rate, from the last sample; None unless memory is growing."""
    psi_some_avg10: float | None
    reason: str

    @property
    def changed(self) -> bool:
        return self.level != self.previous

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": str(self.level),
            "previous": str(self.previous),
            "changed": self.changed,
            "used_bytes": self.used_bytes,
            "limit_bytes": self.limit_bytes,
            "headroom_bytes": self.headroom_bytes,
            "headroom_fraction": self.headroom_fraction,
            "slope_bytes_per_s": self.slope_bytes_per_s,
            "seconds_to_limit": self.seconds_to_limit,
            "psi_some_avg10": self.psi_some_avg10,
            "reason": self.reason,
        }


def _slope(samples: Sequence[MemorySample], policy: RiskPolicy) -> float | None:
    """Least-squares bytes/s over the samples in the trend window; None if it cannot be told."""
    last_t = samples[-1].t
    recent = [s for s in samples if s.t >= last_t - policy.trend_window_s]
    if len(recent) < policy.trend_min_samples:
        return None
    mean_t = sum(s.t for s in recent) / len(recent)
    mean_u = sum(s.used_bytes for s in recent) / len(recent)
    var = sum((s.t - mean_t) ** 2 for s in recent)
    if var == 0:  # all at one instant: no rate
        return None
    return sum((s.t - mean_t) * (s.used_bytes - mean_u) for s in recent) / var


@dataclass(frozen=True)
class _Thresholds:
    """One side of one level: headroom and seconds-to-limit below, PSI above."""

    headroom: float
    seconds_to_limit: float
    psi: float


def _thresholds(policy: RiskPolicy, level: RiskLevel, *, holding: bool) -> _Thresholds:
    if level is RiskLevel.CRITICAL:
        if holding:
            return _Thresholds(
                policy.critical_exit_headroom,
                policy.critical_exit_seconds_to_limit,
                policy.psi_critical_exit,
            )
        return _Thresholds(
            policy.critical_enter_headroom,
            policy.critical_enter_seconds_to_limit,
            policy.psi_critical_enter,
        )
    if holding:
        return _Thresholds(
            policy.warn_exit_headroom, policy.warn_exit_seconds_to_limit, policy.psi_warn_exit
        )
    return _Thresholds(
        policy.warn_enter_headroom, policy.warn_enter_seconds_to_limit, policy.psi_warn_enter
    )


def _signals(
    fraction: float, ttl: float | None, psi: float | None, th: _Thresholds, *, holding: bool
) -> list[str]:
    """The signals past these thresholds, as phrases for the reason.

    Entering needs a value strictly past the enter threshold; a level is held while any value
    is at or short of its exit threshold, i.e. leaving needs every value strictly back past it.
    """
    kind, below, above = ("exit", "≤", "≥") if holding else ("enter", "<", ">")
    out = []
    if fraction <= th.headroom if holding else fraction < th.headroom:
        out.append(f"headroom {fraction:.1%} {below} {th.headroom:.0%} {kind}")
    if ttl is not None and (ttl <= th.seconds_to_limit if holding else ttl < th.seconds_to_limit):
        out.append(f"limit in {ttl:.1f} s {below} {th.seconds_to_limit:g} s {kind}")
    if psi is not None and (psi >= th.psi if holding else psi > th.psi):
        out.append(f"psi some avg10 {psi:g} {above} {th.psi:g} {kind}")
    return out


def assess_risk(
    samples: Sequence[MemorySample],
    limit_bytes: int,
    previous: RiskLevel,
    policy: RiskPolicy,
    plateau_bytes: int | None = None,
) -> RiskAssessment:
    """The OOM-risk level from the recent samples (oldest first) against the hard limit.

    ``limit_bytes`` is where the kernel acts (``EffectiveLimit.bound_bytes``, in the same units
    as the samples), not the planning limit: the margin is for planning, the thresholds here are
    the margin while running. ``previous`` is the last assessment's level (``RiskLevel.OK`` at
    start): with it the thresholds form a hysteresis loop. Critical is checked first, then warn;
    a level is entered when any signal crosses its enter threshold, and held (only when the
    previous level was at least as severe) while any signal is short of its exit threshold.

    ``plateau_bytes`` is where the running plan's memory is measured to level off
    (``core.memfit``); when that fits below the critical headroom, a trend toward the limit is a
    ramp to that plateau, not a march to OOM, and does not count.
    """
    if not samples:
        raise ValueError("assess_risk needs at least one sample")
    _require(
        "assess_risk",
        _is_int(limit_bytes) and limit_bytes > 0,
        "limit_bytes",
        limit_bytes,
        "an integer > 0",
    )
    if any(b.t < a.t for a, b in itertools.pairwise(samples)):
        raise ValueError("assess_risk: samples must be in time order (oldest first)")
    previous = RiskLevel(previous)
    last = samples[-1]
    headroom = limit_bytes - last.used_bytes
    fraction = headroom / limit_bytes
    slope = _slope(samples, policy)
    ttl = max(0, headroom) / slope if slope is not None and slope > 0 else None
    # A trend far from the limit is a ramp (partitions start in bursts): do not act on it. Nor
    # on one that has stopped: after a step up to a plateau the window's slope stays positive
    # for a while, but memory is no longer growing toward the limit.
    plateau_fits = plateau_bytes is not None and plateau_bytes <= limit_bytes * (
        1 - policy.critical_enter_headroom
    )
    trusted = fraction < policy.trend_max_headroom and not plateau_fits
    rising = len(samples) >= 2 and samples[-1].used_bytes > samples[-2].used_bytes
    trend = ttl if trusted and rising else None
    psi = last.psi_some_avg10

    level, why, mode = RiskLevel.OK, [], ""
    for candidate in (RiskLevel.CRITICAL, RiskLevel.WARN):
        entered = _signals(
            fraction, trend, psi, _thresholds(policy, candidate, holding=False), holding=False
        )
        if entered:
            mode = "entered" if previous != candidate else "still"
            level, why = candidate, entered
            break
        if previous.severity >= candidate.severity:
            held = _signals(
                fraction, trend, psi, _thresholds(policy, candidate, holding=True), holding=True
            )
            if held:
                level, why, mode = candidate, held, "holding"
                break

    figures = f"headroom {_fmt_bytes(headroom)} ({fraction:.1%}) of {_fmt_bytes(limit_bytes)}, "
    figures += (
        f"growing {_fmt_bytes(slope)}/s" if slope is not None and slope > 0 else "not growing"
    )
    if ttl is not None:
        figures += f", limit in {ttl:.1f} s" + ("" if trusted else " (ramp: trend not trusted)")
    if psi is not None:
        figures += f", psi {psi:g}"
    reason = f"ok: {figures}" if not why else f"{level} ({mode}): {'; '.join(why)} [{figures}]"
    return RiskAssessment(
        level=level,
        previous=previous,
        used_bytes=last.used_bytes,
        limit_bytes=limit_bytes,
        headroom_bytes=headroom,
        headroom_fraction=fraction,
        slope_bytes_per_s=slope,
        seconds_to_limit=ttl,
        psi_some_avg10=psi,
        reason=reason,
    )


def sample_interval_s(assessment: RiskAssessment, policy: RiskPolicy) -> float:
    """How long until the next sample: fast while memory is at risk."""
    return policy.interval_s if assessment.level is RiskLevel.OK else policy.fast_interval_s


# =================================================================================================
# Benchmark sizing and rate (incidents I5, I6): fit the batch into the manager's budget, and
# measure the rate from wall-clock time.
# =================================================================================================


@dataclass(frozen=True)
class BenchSize:
    """How many proofs the benchmark runs, at what concurrency, and why."""

    count: int
    concurrency: int
    estimated_s: float
    reason: str


def size_bench(
    requested: int,
    concurrency: int,
    per_proof_s: float,
    remaining_s: float,
    safety: float = 1.25,
) -> BenchSize:
    """Largest batch (up to ``requested``) whose estimate fits the remaining budget.

    ``per_proof_s`` is the wall time of one proof alone at full workers (the settle proof). The
    estimate assumes concurrency buys no throughput (true when partitions already fill the
    workers, cuzk.md §3) and adds ``safety``; so a batch that fits here fits in practice.
    At least one proof always runs: a rate needs one, and the manager kills silence anyway.
    """
    if requested < 1 or concurrency < 1:
        raise ValueError("requested and concurrency must be >= 1")
    if per_proof_s <= 0 or safety < 1:
        raise ValueError("per_proof_s must be > 0 and safety >= 1")
    per_proof = per_proof_s * safety
    fits = int(max(0.0, remaining_s) // per_proof)
    count = max(1, min(requested, fits))
    if fits >= requested:
        reason = (
            f"{requested} requested, about {requested * per_proof:.0f} s fit in {remaining_s:.0f} s"
        )
    elif fits >= 1:
        reason = (
            f"cut from {requested} to {count}: {per_proof_s:.1f} s per proof x {safety:g} safety "
            f"leaves room for {fits} in the {remaining_s:.0f} s left of the manager's budget"
        )
    else:
        reason = (
            f"not even one proof ({per_proof_s:.1f} s x {safety:g}) fits the {remaining_s:.0f} s "
            "left; running one anyway so a rate is reported"
        )
    return BenchSize(count, min(concurrency, count), count * per_proof, reason)


def proofs_per_hour(completed: int, wall_s: float) -> float:
    """The benchmark rate: completed proofs / wall-clock seconds × 3600 (0 when nothing ran)."""
    if completed <= 0 or wall_s <= 0:
        return 0.0
    return completed / wall_s * 3600.0
