"""The rate the bench reports, and how it was measured (incidents I5, I6; issue 32).

:func:`choose_measurement` picks the :class:`~cuzk_supervisor.core.bench.Stretch` the rate comes
from (a restart, a step-down or a plan change ends a stretch; a completion heard late does not), and
within it the part the machine holds at the end (:func:`~cuzk_supervisor.core.benchstop.knowledge`:
the whole stretch unless its halves disagree). The result says how well the rate is known
(``uncertainty``, 95 %), whether the machine drifted while it was measured, and, where the budget
could not give the precision asked for, how imprecise the rate is and what it would have taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cuzk_supervisor.core.bench import HOUR_S, BenchPolicy, Stretch
from cuzk_supervisor.core.benchrate import rate_spread, shifted, steady_rate_per_s
from cuzk_supervisor.core.benchstop import knowledge


@dataclass(frozen=True, slots=True)
class RateMeasurement:
    """The reported rate and how it was measured (so a slow machine can be told apart from a
    disturbed measurement on the dashboard)."""

    rate_per_hour: float
    """Proofs per hour on the caller's clock."""
    proofs: int
    """Completions the rate was computed from."""
    interval_s: float
    """From the first to the last of them."""
    concurrency: int
    """Proofs the daemon held (``bench_concurrency`` and ``bench_queue_ahead``)."""
    workers: int
    steady: bool
    """True when it is a measurement of a full pipeline over ``min_proofs`` completions or more."""
    reason: str
    stretches: int = 1
    excluded: tuple[str, ...] = field(default_factory=tuple)
    """Why earlier stretches ended (restarts, step-downs)."""
    stopped: str = ""
    """Why its stretch stopped submitting (:attr:`Stretch.stop`; ``interrupted`` for a stretch a
    restart ended, '' when nothing was measured)."""
    uncertainty: float | None = None
    """Half-width of the rate's 95 % interval, relative to it (None under four kept intervals;
    :func:`~cuzk_supervisor.core.benchrate.rate_spread`)."""
    drift: float | None = None
    """The stretch's latest half's rate over its earliest half's, minus 1."""
    drifted: bool = False
    """The stretch's halves disagreed: the rate is that of its latest part that held still."""
    stretch_proofs: int = 0
    """Completions of the stretch (``proofs`` less when it drifted)."""
    late: int = 0
    """Proofs of the stretch submitted late (each left one interval out of the rate, where the
    runs on both sides were long enough to measure)."""
    precise: bool | None = None
    """The uncertainty is within the precision asked for (None: none was asked for)."""
    needed: int = 0
    """When not precise: about how many proofs the precision would take."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": round(self.rate_per_hour, 3),
            "proofs": self.proofs,
            "interval_s": round(self.interval_s, 3),
            "concurrency": self.concurrency,
            "workers": self.workers,
            "steady": self.steady,
            "reason": self.reason,
            "stretches": self.stretches,
            "excluded": list(self.excluded),
            "stopped": self.stopped,
            "uncertainty_pct": _pct(self.uncertainty),
            "drift_pct": _pct(self.drift),
            "drifted": self.drifted,
            "stretch_proofs": self.stretch_proofs,
            "late": self.late,
            "precise": self.precise,
            "needed": self.needed,
        }


def _pct(value: float | None) -> float | None:
    return round(value * 100, 3) if value is not None else None


def _latency_rate(stretch: Stretch) -> tuple[float, float]:
    latency = max(stretch.completions[0] - stretch.started_at, 1e-9)
    return HOUR_S / latency, latency


def proofs_for(precision: float, uncertainty: float, proofs: int) -> int:
    """About how many proofs make ``uncertainty`` (from ``proofs``) ``precision``: the
    standard error shrinks with the square root of the intervals."""
    intervals = max(1, proofs - 1)
    return math.ceil(intervals * (uncertainty / precision) ** 2) + 1


def measure(stretch: Stretch, policy: BenchPolicy) -> dict[str, Any]:
    """The figures of one stretch: its rate (of the part that holds still), uncertainty,
    drift, and whether that meets ``policy.precision``."""
    done, breaks = stretch.completions, stretch.breaks
    figures: dict[str, Any] = {"stretch_proofs": len(done), "late": len(stretch.late)}
    if not done:
        return {**figures, "rate_per_hour": 0.0, "proofs": 0, "interval_s": 0.0}
    known = knowledge(done, breaks, policy.stop_rule)
    part, part_breaks = done[known.start :], shifted(breaks, known.start)
    rate = steady_rate_per_s(part, part_breaks)
    if rate is None:
        rate_h, span = _latency_rate(stretch)
    else:
        rate_h, span = rate * HOUR_S, part[-1] - part[0]
    whole = rate_spread(done, breaks)
    uncertainty = known.half_width
    figures.update(
        rate_per_hour=rate_h, proofs=len(part), interval_s=span, uncertainty=uncertainty,
        drift=whole.drift if whole is not None else None, drifted=known.drifting,
    )  # fmt: skip
    if policy.precision > 0:
        precise = uncertainty is not None and uncertainty <= policy.precision
        figures["precise"] = precise
        if not precise:
            needed = max(policy.min_proofs, 5)
            if uncertainty is not None:
                needed = proofs_for(policy.precision, uncertainty, len(part))
            figures["needed"] = needed
    return figures


def choose_measurement(stretches: Sequence[Stretch], policy: BenchPolicy) -> RateMeasurement:
    """The rate to report from the bench's stretches (the last one is the current plan's).

    1. The last stretch, when it ran to its end with ``min_proofs`` completions: the normal case.
    2. Else the longest stretch at the current plan with ``min_proofs`` completions, uninterrupted
       while it lasted (an interrupted stretch's completions before the restart still measured a
       full pipeline; the proofs lost in the restart are not counted).
    3. Else what was measured, marked short: the stretch with the most completions (a rate from
       two or more, else one proof's latency); rate 0 when no proof completed.

    Within the stretch the rate is of the part that held still (the whole unless it drifted)."""
    excluded = tuple(s.interrupted for s in stretches if s.interrupted)
    if not stretches:
        return RateMeasurement(0.0, 0, 0.0, policy.held, 0, False, "no proof ran")

    def measured(stretch: Stretch, steady: bool, label: str, tail: str = "") -> RateMeasurement:
        figures = measure(stretch, policy)
        n, span = figures["proofs"], figures["interval_s"]
        noun = "proofs" if steady else "proof(s)"
        reason = f"{label}: {n} {noun} over {span:.1f} s{tail}" if n else label
        if figures.get("drifted"):
            reason += (
                f"; drifted ({figures['drift']:+.1%} between its halves): the rate of its "
                f"last {n} of {figures['stretch_proofs']} proofs"
            )
        if figures.get("precise") is False and n:
            known = figures.get("uncertainty")
            spread = f"±{known:.1%}" if known is not None else "± unknown"
            reason += (
                f"; imprecise: {spread} from {n} proofs, ±{policy.precision:.1%} would take "
                f"about {figures['needed']} proofs"
            )
        return RateMeasurement(
            concurrency=stretch.concurrency, workers=stretch.workers, steady=steady,
            reason=reason, stretches=len(stretches), excluded=excluded,
            stopped=stretch.stop or ("interrupted" if stretch.interrupted else ""), **figures,
        )  # fmt: skip

    current = stretches[-1].workers
    at_plan = [s for s in stretches if s.workers == current]
    enough = [s for s in at_plan if len(s.completions) >= policy.min_proofs]
    last = stretches[-1]
    if not last.interrupted and len(last.completions) >= policy.min_proofs:
        after = f", measured after {len(excluded)} interruption(s)" if excluded else ""
        return measured(last, True, "steady", after)
    if enough:
        best = max(enough, key=lambda s: (len(s.completions), stretches.index(s)))
        since = "; ".join(excluded) or "none"
        return measured(best, True, "longest uninterrupted stretch",
                        f" (no time for a new measurement after: {since})")  # fmt: skip
    pool = at_plan if any(s.completions for s in at_plan) else list(stretches)
    best = max(pool, key=lambda s: (len(s.completions), pool.index(s)))
    if not best.completions:
        return measured(best, False, "no proof completed")
    why = "; ".join(excluded) if excluded else "the budget held no more"
    return measured(best, False, "short",
                    f", fewer than bench_min_proofs {policy.min_proofs} ({why})")  # fmt: skip
