"""OOM risk: is memory at risk now, judged from recent samples (incident I4: act before the
kernel does).

Three signals: headroom to the hard limit, PSI ("some" avg10, % of time stalled on memory) and
the trend (seconds to the limit at the recent least-squares growth rate). Hysteresis: a level is
entered when a signal crosses its enter threshold and kept until every signal is back past its
exit threshold, so a value hovering at a threshold does not flap. Pure: sample times are
arguments (monotonic seconds), nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cuzk_supervisor.core.checks import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    Rule,
    in_range,
    int_above,
    int_at_least,
    is_number,
    require_fields,
    require_relation,
    require_value,
)
from cuzk_supervisor.core.units import fmt_bytes


class RiskLevel(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def severity(self) -> int:
        """0, 1, 2: compare levels by this (the strings themselves sort alphabetically)."""
        return {"ok": 0, "warn": 1, "critical": 2}[self.value]


_PERCENTAGE = Rule(lambda v: is_number(v) and 0 <= v <= 100, "a percentage in [0, 100]")


@dataclass(frozen=True)
class MemorySample:
    """One reading: when (monotonic seconds), memory in use, and PSI some avg10 if known."""

    t: float
    used_bytes: int
    psi_some_avg10: float | None = None

    def __post_init__(self) -> None:
        require_fields(self, ("t",), FINITE)
        require_fields(self, ("used_bytes",), int_at_least(0))
        require_fields(self, ("psi_some_avg10",), _PERCENTAGE.or_none())


@dataclass(frozen=True)
class RiskPolicy:
    """Thresholds of the OOM-risk levels. A level entered is held until every signal is back past
    its exit threshold (above it for headroom and seconds to the limit, below it for PSI)."""

    warn_enter_headroom: float = 0.15
    """Enter warn when headroom (free fraction of the limit) falls below this."""
    warn_exit_headroom: float = 0.20
    critical_enter_headroom: float = 0.05
    critical_exit_headroom: float = 0.08
    warn_enter_seconds_to_limit: float = 30.0
    """Enter warn when the limit is this close at the recent growth rate."""
    warn_exit_seconds_to_limit: float = 60.0
    """Leave warn only when the limit is at least this far away (or memory is not growing)."""
    critical_enter_seconds_to_limit: float = 10.0
    critical_exit_seconds_to_limit: float = 20.0
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
    psi_critical_enter: float = 40.0
    """Enter critical when PSI some avg10 rises above this: the host is reclaiming hard."""
    psi_critical_exit: float = 25.0
    interval_s: float = 1.0
    """Seconds between samples while the level is ok."""
    fast_interval_s: float = 0.1
    """Seconds between samples while the level is warn or critical."""

    def __post_init__(self) -> None:
        fields = self.__dataclass_fields__
        require_fields(self, fields, FINITE)
        require_fields(self, [f for f in fields if f.endswith("_headroom")], in_range(0, 1))
        require_fields(self, [f for f in fields if f.startswith("psi_")], in_range(0, 100))
        require_fields(self, ("trend_window_s", "interval_s", "fast_interval_s"), POSITIVE)
        require_fields(self, [f for f in fields if f.endswith("_seconds_to_limit")], NON_NEGATIVE)
        require_fields(self, ("trend_min_samples",), int_at_least(2))
        # Hysteresis runs the right way: exits are easier to hold than entries to reach, and
        # critical is never easier to enter than warn. Headroom and seconds to the limit are
        # "at risk" when low, PSI when high.
        require_relation(self, "critical_exit_headroom", ">=", "critical_enter_headroom")
        require_relation(self, "warn_exit_headroom", ">=", "warn_enter_headroom")
        require_relation(self, "warn_enter_headroom", ">=", "critical_enter_headroom")
        require_relation(
            self, "critical_exit_seconds_to_limit", ">=", "critical_enter_seconds_to_limit"
        )
        require_relation(self, "warn_exit_seconds_to_limit", ">=", "warn_enter_seconds_to_limit")
        require_relation(
            self, "warn_enter_seconds_to_limit", ">=", "critical_enter_seconds_to_limit"
        )
        require_relation(self, "psi_critical_exit", "<=", "psi_critical_enter")
        require_relation(self, "psi_warn_exit", "<=", "psi_warn_enter")
        require_relation(self, "psi_warn_enter", "<=", "psi_critical_enter")


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
        """The fields of a log event: the level as ``risk`` (an event's ``level`` is its log
        level, which structlog sets over any field of that name)."""
        return {
            "risk": str(self.level),
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
    """One side of one level: headroom and seconds-to-limit below, PSI above; the exit side
    while ``holding`` the level, else the enter side."""

    headroom: float
    seconds_to_limit: float
    psi: float
    holding: bool


def _thresholds(policy: RiskPolicy, level: RiskLevel, *, holding: bool) -> _Thresholds:
    p = policy
    if level is RiskLevel.CRITICAL:
        if holding:
            return _Thresholds(p.critical_exit_headroom, p.critical_exit_seconds_to_limit,
                               p.psi_critical_exit, holding)  # fmt: skip
        return _Thresholds(p.critical_enter_headroom, p.critical_enter_seconds_to_limit,
                           p.psi_critical_enter, holding)  # fmt: skip
    if holding:
        return _Thresholds(p.warn_exit_headroom, p.warn_exit_seconds_to_limit, p.psi_warn_exit,
                           holding)  # fmt: skip
    return _Thresholds(p.warn_enter_headroom, p.warn_enter_seconds_to_limit, p.psi_warn_enter,
                       holding)  # fmt: skip


def _signals(fraction: float, ttl: float | None, psi: float | None, th: _Thresholds) -> list[str]:
    """The signals past these thresholds, as phrases for the reason: entering needs a value
    strictly past the enter threshold, leaving needs every value strictly back past the exit one."""
    holding = th.holding
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
    ``limit_bytes`` is where the kernel acts (``EffectiveLimit.bound_bytes``, in the same units as
    the samples), not the planning limit: the margin is for planning, the thresholds here are the
    margin while running. ``previous`` is the last assessment's level (``RiskLevel.OK`` at start),
    for the hysteresis: critical is checked first, then warn, and a level is held only where the
    previous one was at least as severe. ``plateau_bytes`` is where the running plan's memory is
    measured to level off (``core.memfit``); when that fits below the critical headroom, a trend
    toward the limit is a ramp to that plateau, not a march to OOM, and does not count."""
    if not samples:
        raise ValueError("assess_risk needs at least one sample")
    require_value("assess_risk", "limit_bytes", limit_bytes, int_above(0))
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
    below_critical = limit_bytes * (1 - policy.critical_enter_headroom)
    plateau_fits = plateau_bytes is not None and plateau_bytes <= below_critical
    trusted = fraction < policy.trend_max_headroom and not plateau_fits
    rising = len(samples) >= 2 and samples[-1].used_bytes > samples[-2].used_bytes
    trend = ttl if trusted and rising else None
    psi = last.psi_some_avg10

    level, why, mode = RiskLevel.OK, [], ""
    for candidate in (RiskLevel.CRITICAL, RiskLevel.WARN):
        entered = _signals(fraction, trend, psi, _thresholds(policy, candidate, holding=False))
        if entered:
            mode = "entered" if previous != candidate else "still"
            level, why = candidate, entered
            break
        if previous.severity >= candidate.severity:
            held = _signals(fraction, trend, psi, _thresholds(policy, candidate, holding=True))
            if held:
                level, why, mode = candidate, held, "holding"
                break

    figures = f"headroom {fmt_bytes(headroom)} ({fraction:.1%}) of {fmt_bytes(limit_bytes)}, "
    figures += f"growing {fmt_bytes(slope)}/s" if slope is not None and slope > 0 else "not growing"
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
