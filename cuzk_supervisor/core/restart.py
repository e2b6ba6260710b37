"""Restart policy: how long to wait before restarting a failed daemon, and when to stop trying.

The shape follows the kubelet's crash-loop backoff (exponential, capped, reset after a stable
run) with tenacity's habit of making the strategy a printable, comparable value. A crash loop
(too many failures too close together) is a verdict, not a longer sleep: the caller reports it.

The time (a monotonic clock reading, in seconds) and the jitter's random draw are arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuzk_supervisor.core.checks import (
    FINITE,
    POSITIVE,
    Rule,
    in_range,
    int_at_least,
    require_fields,
    require_relation,
)


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart the daemon after a failure; a value you can print, compare and log. The delay
    before the n-th consecutive restart (n = 1, 2, ...) is, before jitter,
    ``min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))``. Jitter only ever shortens it:
    the delay is drawn from ``(base * (1 - jitter), base]``, so ``jitter=1.0`` is "full jitter" and
    the cap is never exceeded. After ``stable_after_s`` of health the count starts over.
    ``crash_loop_failures`` failures within ``crash_loop_window_s`` mean give up."""

    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2
    stable_after_s: float = 600.0
    crash_loop_failures: int = 5
    crash_loop_window_s: float = 300.0

    def __post_init__(self) -> None:
        floats = [n for n in self.__dataclass_fields__ if n != "crash_loop_failures"]
        require_fields(self, floats, FINITE)
        require_fields(self, ("initial_backoff_s",), POSITIVE)
        require_relation(self, "max_backoff_s", ">=", "initial_backoff_s")
        # Below 1 the curve would shrink with every failure.
        require_fields(self, ("multiplier",), Rule(lambda v: v >= 1, ">= 1"))
        require_fields(self, ("jitter",), in_range(0, 1))
        require_fields(self, ("stable_after_s",), POSITIVE)
        require_fields(self, ("crash_loop_failures",), int_at_least(1))
        require_fields(self, ("crash_loop_window_s",), POSITIVE)


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
    ``healthy_since``: when the daemon last became healthy; None while it is not."""

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
    """The history after the daemon failed at ``now`` for ``reason``. It takes the policy so that it
    can forget what no longer matters: a stable run before this failure resets the count, and
    failures outside the crash-loop window are dropped."""
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
    """Restart (after how long) or give up, given the history at ``now``. ``rand`` is a uniform draw
    from [0, 1) (``random.random()``). Called after ``record_failure``; called after the stable
    period of health (a restart for another reason) it answers the initial delay."""
    _check_time(history, now)
    _check_rand(rand)
    if _stable(policy, history, now):
        history = RestartHistory()
    window = policy.crash_loop_window_s
    recent = [f for f in history.failures if now - f.at <= window]
    if len(recent) >= policy.crash_loop_failures:
        return GiveUp(reason=recent[-1].reason, failures=len(recent), window_s=window)
    attempt = max(1, history.attempt)
    reason = history.failures[-1].reason if history.failures else ""
    delay = jittered_backoff_s(policy, attempt, rand)
    return Restart(delay_s=delay, attempt=attempt, reason=reason)


def _stable(policy: RestartPolicy, history: RestartHistory, now: float) -> bool:
    since = history.healthy_since
    return since is not None and now - since >= policy.stable_after_s


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
