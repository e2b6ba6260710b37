"""A stretch's rate and how well it is known (issue 32): pure arithmetic on completion times.

Completion times are on one clock the caller chooses (the daemon's, as the lifecycle stamps them).

**The rate** is the pipeline's steady throughput: the least-squares slope of the completion
times against their count (seconds per proof; the rate is its inverse), which leaves out the
fill before the first completion and lets the lumps of a partition pipeline (intervals that
alternate with the partition rounds) average out instead of deciding the figure.

**Breaks.** A proof submitted late (its predecessor heard late, a supervisor starved of CPU)
leaves the pipeline idle where it had no slack: the completions after it come later by up to
that wait, which is the client's, not the machine's. The interval that holds it (see
:attr:`~cuzk_supervisor.core.bench.Stretch.breaks`) is *broken*: it is left out, and the slope is
pooled over the pieces between breaks (each piece keeps its own offset, they share one slope).

**The uncertainty** comes from batch means (Law & Kelton, *Simulation Modeling and Analysis*,
§9.5.3; Schmeiser 1982, "Batch size effects in the analysis of simulation output"): the kept
intervals are cut into at most :data:`BATCHES` consecutive batches, the spread of the batch
means estimates the variance of the mean interval, and the half-width takes Student's t at the
batches' degrees of freedom. It assumes that batches of a few consecutive intervals are roughly
independent: a slowly wandering speed (positively correlated intervals) is inside a batch once
batches span it, and the lumps of a pipeline (a cycle of intervals that repeats with the
partition rounds, :func:`cycle`) are kept inside by batches of whole cycles. Batches grow with
the stretch, so the interval stays honest as it lengthens; with few intervals it is wide (t
with 3 or 4 degrees of freedom), the price of not assuming the intervals independent. While a
batch holds a single interval, the larger of that estimate and the one from successive
differences (von Neumann) is used. The slope's variance under a random walk of completion times
is up to :data:`SLOPE_VARIANCE_FACTOR` times the mean interval's; that factor is applied.

**Drift.** The stretch's halves are compared, each by its own slope: a difference beyond the
99 % interval of the difference (from successive differences, which a step or a trend does not
inflate) and beyond the caller's tolerance means the machine moved while it was measured (a GPU
reaching its power cap, a CPU warming into its throttle). :func:`settled_start` then finds the
latest part of the stretch that holds still: the rate the machine holds at the end.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.core.checks import require

BATCHES = 5
"""Batch means at most: with more, each batch spans fewer pipeline cycles."""
SLOPE_VARIANCE_FACTOR = 1.2
"""The least-squares slope's variance over the mean interval's, under random-walk completions."""
CYCLE_CORRELATION = 0.5
"""Intervals that correlate with themselves this much at a lag repeat a pattern (a cycle)."""
MIN_CYCLE_INTERVALS = 4
"""Intervals before a cycle is looked for (twice this)."""
DRIFT_CONFIDENCE = 0.99
"""The halves differ when this two-sided interval of their difference excludes 0."""

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


def pieces(completions: Sequence[float], breaks: Collection[int] = ()) -> list[Sequence[float]]:
    """The runs of ``completions`` between broken intervals; interval ``i`` runs from completion
    ``i - 1`` to completion ``i`` (so 1 <= i < len)."""
    cuts = sorted(i for i in set(breaks) if 0 < i < len(completions))
    bounds = [0, *cuts, len(completions)]
    return [completions[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def kept_intervals(completions: Sequence[float], breaks: Collection[int] = ()) -> list[float]:
    """The intervals between consecutive completions, in order, less the broken ones."""
    return [b - a for piece in pieces(completions, breaks) for a, b in itertools.pairwise(piece)]


def seconds_per_proof(completions: Sequence[float], breaks: Collection[int] = ()) -> float | None:
    """The slope of the completion times against their count, pooled over the pieces (each piece
    centred on its own means); None without two completions in one piece or time between them."""
    sxx = sxy = 0.0
    for piece in pieces(completions, breaks):
        n = len(piece)
        if n < 2:
            continue
        mean_k, mean_t = (n - 1) / 2, sum(piece) / n
        sxx += sum((k - mean_k) ** 2 for k in range(n))
        sxy += sum((k - mean_k) * (t - mean_t) for k, t in enumerate(piece))
    if sxx <= 0 or sxy <= 0:
        return None
    return sxy / sxx


def steady_rate_per_s(completions: Sequence[float], breaks: Collection[int] = ()) -> float | None:
    """Throughput of a full pipeline, in proofs per second: 1 / :func:`seconds_per_proof`."""
    spp = seconds_per_proof(completions, breaks)
    return 1.0 / spp if spp is not None else None


@dataclass(frozen=True, slots=True)
class RateSpread:
    """How well a run of completions knows its rate (see the module's text)."""

    intervals: int
    """Kept intervals."""
    batches: int
    relative_se: float
    """Standard error of the rate, relative to it."""
    drift: float
    """The latest half's rate over the earliest half's, minus 1 (> 0 when it got faster)."""
    drift_se: float
    """Standard error of ``drift``."""
    noise_se: float = 0.0
    """Standard error of the rate, relative, from the successive differences of the intervals
    (von Neumann): a second estimate, for rules that must not trust a lucky low one."""

    def half_width(self, confidence: float) -> float:
        """Half-width of the two-sided interval of the rate, relative to it: from the batch means
        once each batch holds two intervals or more, else from the larger standard error."""
        se = self.relative_se
        if self.intervals < 2 * BATCHES:
            se = max(se, self.noise_se)
        return t_quantile(self.batches - 1, confidence) * se

    def cautious_width(self, confidence: float) -> float:
        """As :meth:`half_width`, always from the larger of the two standard errors: what a
        rule that looks at every completion holds to, as one of them may be low by chance."""
        return t_quantile(self.batches - 1, confidence) * max(self.relative_se, self.noise_se)

    def drifting(self, tolerance: float = 0.0) -> bool:
        """The halves differ beyond the 99 % interval of their difference and ``tolerance``."""
        beyond = t_quantile(max(1, self.intervals - 2), DRIFT_CONFIDENCE) * self.drift_se
        return abs(self.drift) > max(beyond, tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uncertainty_pct": round(self.half_width(0.95) * 100, 3),
            "drift_pct": round(self.drift * 100, 3),
        }


def _batches(gaps: Sequence[float]) -> list[tuple[int, int]]:
    """Consecutive batches of the intervals: :data:`BATCHES` of near-equal size, or, where the
    intervals repeat a pattern (:func:`cycle`), whole cycles each over the latest ones."""
    count = len(gaps)
    period = cycle(gaps)
    if period > 1 and count // period >= 3:
        size = period * max(1, count // (BATCHES * period))
        k = count // size
        first = count - k * size
        return [(first + j * size, first + (j + 1) * size) for j in range(k)]
    k = min(BATCHES, count)
    bounds = [round(j * count / k) for j in range(k + 1)]
    return list(itertools.pairwise(bounds))


def cycle(gaps: Sequence[float]) -> int:
    """The pipeline's cycle, in intervals, where the intervals show one: the shortest lag at
    which they correlate with themselves by :data:`CYCLE_CORRELATION` or more after a first lag
    that alternates (the partition rounds of a plan whose workers do not divide the partitions:
    two short intervals and a long one, again and again); 1 where they show none. Any batch
    size is as valid for independent intervals, so a cycle read into noise costs degrees of
    freedom, never the interval's honesty."""
    m = len(gaps)
    if m < 2 * MIN_CYCLE_INTERVALS:
        return 1
    mean = sum(gaps) / m
    var = sum((g - mean) ** 2 for g in gaps)
    if var <= 0:
        return 1

    def correlation(lag: int) -> float:
        return sum((gaps[i] - mean) * (gaps[i + lag] - mean) for i in range(m - lag)) / var

    if correlation(1) >= 0:
        return 1
    return next((lag for lag in range(2, m // 3 + 1) if correlation(lag) >= CYCLE_CORRELATION), 1)


def rate_spread(completions: Sequence[float], breaks: Collection[int] = ()) -> RateSpread | None:
    """The spread of the rate of ``completions`` (ascending); None with fewer than three kept
    intervals or no time in them."""
    gaps = kept_intervals(completions, breaks)
    m = len(gaps)
    if m < 3 or sum(gaps) <= 0:
        return None
    mean = sum(gaps) / m
    batches = _batches(gaps)
    means = [(sum(gaps[a:b]) / (b - a), b - a) for a, b in batches]
    centre = sum(y * size for y, size in means) / sum(size for _, size in means)
    # Per-interval long-run variance from the batch means (weighted by their sizes).
    lrv = sum(size * (y - centre) ** 2 for y, size in means) / (len(means) - 1)
    relative_se = math.sqrt(SLOPE_VARIANCE_FACTOR * lrv / m) / mean
    # The noise of one interval from successive differences (von Neumann's mean square
    # successive difference): a step or a trend between the halves is not counted as noise, as
    # it would be in their spread around the mean.
    noise = sum((b - a) ** 2 for a, b in itertools.pairwise(gaps)) / (2 * (m - 1))
    noise_se = math.sqrt(SLOPE_VARIANCE_FACTOR * noise / m) / mean
    drift, early, late = _halves(completions, breaks)
    drift_se = math.sqrt(SLOPE_VARIANCE_FACTOR * noise * (1 / early + 1 / late)) / mean
    return RateSpread(m, len(means), relative_se, drift, drift_se, noise_se)


def _halves(completions: Sequence[float], breaks: Collection[int]) -> tuple[float, int, int]:
    """The latest half's rate over the earliest half's, minus 1, each half's rate its own
    slope (the halves share the middle completion), and their kept intervals."""
    middle = len(completions) // 2
    early, late = completions[: middle + 1], completions[middle:]
    late_breaks = shifted(breaks, middle)
    spp_early, spp_late = seconds_per_proof(early, breaks), seconds_per_proof(late, late_breaks)
    counts = len(kept_intervals(early, breaks)), len(kept_intervals(late, late_breaks))
    if spp_early is None or spp_late is None or min(counts) == 0:
        return 0.0, max(1, counts[0]), max(1, counts[1])
    return spp_early / spp_late - 1, counts[0], counts[1]


def settled_start(
    completions: Sequence[float], breaks: Collection[int], floor: int, tolerance: float
) -> int:
    """Where the latest part of the stretch that holds still begins: 0 when the halves of the
    whole do not drift (:meth:`RateSpread.drifting` with ``tolerance``); else the part after
    the most likely change (:func:`change_point`), cut again while it still drifts. Never later
    than leaves ``floor`` completions; a stretch that drifts down to that returns it."""
    n = len(completions)
    last = max(0, n - floor)
    start = 0
    while True:
        part_breaks = shifted(breaks, start)
        spread = rate_spread(completions[start:], part_breaks)
        if spread is None or not spread.drifting(tolerance) or start >= last:
            return start
        cut = change_point(completions[start:], part_breaks, floor)
        start = min(last, start + max(1, cut))


def change_point(completions: Sequence[float], breaks: Collection[int], floor: int) -> int:
    """The completion after which the intervals change most likely (least squares: two means,
    one before and one after, fit the kept intervals best), leaving ``floor`` completions after
    it; 0 with too few."""
    kept = [
        (i, completions[i] - completions[i - 1])
        for i in range(1, len(completions))
        if i not in breaks
    ]
    best, best_cost = 0, math.inf
    for cut in range(1, len(completions) - floor + 1):
        before = [g for i, g in kept if i <= cut]
        after = [g for i, g in kept if i > cut]
        if not before or len(after) < 2:
            continue
        cost = _sse(before) + _sse(after)
        if cost < best_cost:
            best, best_cost = cut, cost
    return best


def _sse(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values)


def shifted(breaks: Collection[int], start: int) -> frozenset[int]:
    """``breaks`` of a stretch, as those of its part from completion ``start`` on."""
    return frozenset(i - start for i in breaks if i - start > 0)
