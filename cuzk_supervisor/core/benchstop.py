"""When an adaptive bench knows enough (issue 25, item 5): its rate's uncertainty, and the rule
that ends a stretch once the rate is known within ``precision`` (and its verdict against the
minimum rate is certain), lets it go on past its batch while the rate is too close to the
minimum to tell, and ends it there as soon as the verdict is certain.

Pure: completion times are numbers on one clock the caller chooses; nothing here reads a clock.

**The uncertainty.** In a closed loop the completion times are a sum of intervals: a proof that
runs slow delays every completion after it, so the times wander like a random walk around the
least-squares line. The residuals of that line would then promise a precision the data does not
hold (their spread grows with the walk, the slope's error shrinks far slower than they say). The
intervals between completions are the samples instead: the rate's relative standard error is
the intervals' coefficient of variation over √(number of intervals), times 1.1 (the
least-squares slope spreads up to √1.2 times the mean interval's under that noise), and a
half-width takes Student's t at the intervals' degrees of freedom, so a few proofs that happen
to agree do not pass for a known rate. A deterministic pipeline whose intervals alternate (the
partition rounds of a worker count that does not divide the partitions) shows that alternation
as spread: it is judged uncertain and runs its batch, as a fixed batch would.

**The drift.** A rate still moving (a GPU warming into its throttle, a slow start) must not be
caught on its fast stretch: the latest half of the completions is measured on its own, and its
difference from the whole counts against the precision and widens the verdict's interval.

**Why stopping does not bend the rate.** A stretch ends before its batch only on the rate's
spread and drift, never on whether the rate is high or low: a certain verdict with an imprecise
rate runs the batch, as a fixed batch would. The minimum only decides whether it goes on past
the batch (a certain verdict needs the whole 99 % interval, drift included, on one side). A
stretch is stopped by closing it: proofs in flight finish and count, as a fixed batch's last
ones do, and the pipeline is never left underfed and then refilled.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.core.checks import (
    in_range,
    int_at_least,
    number_at_least,
    require,
    require_fields,
)

PRECISION_CONFIDENCE = 0.95
"""The precision is the half-width of this two-sided interval, relative to the rate."""
VERDICT_CONFIDENCE = 0.99
"""A verdict is certain when this two-sided interval lies on one side of the minimum rate."""
SLOPE_SPREAD_FACTOR = 1.1
"""The least-squares slope's spread over the mean interval's, under random-walk completions."""
MIN_COMPLETIONS = 5
"""Four intervals, whatever the floor: with one or two, intervals that happen to agree would
pass a noisy rate for a known one (Student's t allows for it on average, not on the run that
stopped)."""
RESOLUTION = 0.001
"""The narrowest relative half-width the verdict uses: completions stamped to the millisecond
and a pipeline's own fill and drain do not tell rates closer than 0.1 % apart."""

# Student's t, two-sided, by degrees of freedom (a df between two keys takes the lower key's,
# larger, value); beyond the last key the normal quantile.
_T: dict[float, tuple[tuple[int, float], ...]] = {
    0.95: (
        (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
        (8, 2.306), (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086),
        (25, 2.060), (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980),
    ),
    0.99: (
        (1, 63.657), (2, 9.925), (3, 5.841), (4, 4.604), (5, 4.032), (6, 3.707), (7, 3.499),
        (8, 3.355), (9, 3.250), (10, 3.169), (12, 3.055), (15, 2.947), (20, 2.845),
        (25, 2.787), (30, 2.750), (40, 2.704), (60, 2.660), (120, 2.617),
    ),
}  # fmt: skip
_Z = {0.95: 1.960, 0.99: 2.576}


def t_quantile(df: int, confidence: float) -> float:
    """Student's t for a two-sided ``confidence`` interval (0.95 or 0.99) at ``df`` >= 1."""
    require(df >= 1, "t_quantile", "df", df, ">= 1")
    table = _T[confidence]
    if df > table[-1][0]:
        return _Z[confidence]
    return next(t for key, t in reversed(table) if key <= df)


@dataclass(frozen=True, slots=True)
class RateSpread:
    """How well a run of completions knows its rate (see the module's text)."""

    intervals: int
    relative_se: float
    """Standard error of the rate, relative to it."""
    drift: float
    """The latest half's rate over the whole's, minus 1 (signed: > 0 when it got faster)."""

    def half_width(self, confidence: float) -> float:
        """Half-width of the two-sided interval, relative to the rate."""
        return t_quantile(self.intervals - 1, confidence) * self.relative_se

    def to_dict(self) -> dict[str, Any]:
        return {
            "uncertainty_pct": round(self.half_width(PRECISION_CONFIDENCE) * 100, 3),
            "drift_pct": round(self.drift * 100, 3),
        }


def rate_spread(completions: Sequence[float]) -> RateSpread | None:
    """The spread of the rate of ``completions`` (ascending); None with fewer than three (two
    intervals show a spread) or no time between the first and the last."""
    n = len(completions)
    if n < 3 or completions[-1] <= completions[0]:
        return None
    gaps = [b - a for a, b in itertools.pairwise(completions)]
    m = len(gaps)
    mean = (completions[-1] - completions[0]) / m
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (m - 1))
    latest = completions[n // 2 :]
    latest_mean = (latest[-1] - latest[0]) / (len(latest) - 1)
    drift = mean / latest_mean - 1 if latest_mean > 0 else math.inf
    return RateSpread(m, SLOPE_SPREAD_FACTOR * sd / mean / math.sqrt(m), drift)


@dataclass(frozen=True, slots=True)
class StopRule:
    """What an adaptive stretch holds itself to (from ``BenchPolicy``)."""

    precision: float
    """Stop once the rate's 95 % half-width and its drift are both within this fraction; 0: off
    (the whole ``batch``)."""
    floor: int
    """Completions before anything stops the stretch early."""
    batch: int
    """Proofs submitted when neither precision nor a certain verdict came first."""
    most: int
    """Proofs submitted at most while the rate is too close to ``min_rate_per_s`` to tell."""
    min_rate_per_s: float = 0.0
    """The minimum rate on the completions' clock; 0: no verdict to wait for (a local run)."""

    def __post_init__(self) -> None:
        require_fields(self, ("precision",), in_range(0, 1, high_open=True))
        require_fields(self, ("floor", "batch", "most"), int_at_least(1))
        require_fields(self, ("min_rate_per_s",), number_at_least(0))


@dataclass(frozen=True, slots=True)
class StopCall:
    stop: bool
    kind: str
    """Why it stops: ``precision`` ('' while it goes on)."""
    reason: str
    limit: int
    """Proofs the stretch may submit in all, as things stand: ``batch``, or ``most`` while the
    rate is too close to the minimum to tell."""


def stop_call(completions: Sequence[float], rate_per_s: float | None, rule: StopRule) -> StopCall:
    """Whether a stretch with ``completions`` (since its last stall) and the steady rate
    ``rate_per_s`` (the reported estimate) stops submitting now, and how far it may go.

    - Never below ``floor`` completions, nor below :data:`MIN_COMPLETIONS`.
    - Stop (kind ``precision``) when the 95 % half-width and the drift are both within
      ``precision`` and, with a minimum rate, the verdict is certain: the 99 % interval (at
      least :data:`RESOLUTION` wide) widened by the drift lies on one side of it.
    - While that interval straddles the minimum, go on up to ``most`` proofs, precise or not (a
      rate known within 1 % but 0.5 % from the minimum is not a verdict); once it no longer
      does, the limit is ``batch`` again: past it, the stretch ends there (``verdict-certain``,
      :func:`cuzk_supervisor.core.bench.next_submission` names it).
    - A certain verdict alone does not cut the batch short: an imprecise rate that is clearly
      on one side would be reported with its error (a lumpy pipeline's early rate is off by
      several per cent), and the fleet compares the rates, not only the verdicts (I6).
    """
    if rule.precision <= 0:
        return StopCall(False, "", "", rule.batch)
    n, floor = len(completions), max(rule.floor, MIN_COMPLETIONS)
    if n < floor:
        return StopCall(False, "", f"below the floor ({n} of {floor} completions)", rule.batch)
    spread = rate_spread(completions)
    if spread is None or rate_per_s is None or rate_per_s <= 0:
        return StopCall(False, "", "no rate yet", rule.batch)
    half = spread.half_width(PRECISION_CONFIDENCE)
    drift = abs(spread.drift)
    precise = half <= rule.precision and drift <= rule.precision
    known = f"±{half:.2%} (drift {spread.drift:+.2%}) over {n} completions"
    side = ""
    if rule.min_rate_per_s > 0:
        wide = max(spread.half_width(VERDICT_CONFIDENCE), RESOLUTION) + drift
        low, high = rate_per_s * (1 - wide), rate_per_s * (1 + wide)
        if low > rule.min_rate_per_s:
            side = ", above the minimum at 99 %"
        elif high < rule.min_rate_per_s:
            side = ", below the minimum at 99 %"
        else:
            why = f"too close to the minimum to tell: rate {known}"
            return StopCall(False, "", why, max(rule.batch, rule.most))
    if precise:
        return StopCall(True, "precision", f"precision: rate {known}{side}", rule.batch)
    why = f"not yet within ±{rule.precision:.2%}: rate {known}{side}"
    return StopCall(False, "", why, rule.batch)
