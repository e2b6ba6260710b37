"""When an adaptive bench knows enough (issue 25 item 5, issue 32): the rule that ends a stretch
once the rate the machine holds is known within ``precision`` (and its verdict against the
minimum rate is certain), and lets it go on past its batch while it is not. The rate and its
uncertainty are :mod:`cuzk_supervisor.core.benchrate`'s.

**No early stop on a moving machine.** A stretch ends before its batch only when all of these
hold: ``floor`` completions (and :data:`MIN_COMPLETIONS`); ``soak_s`` of the stretch's own
time since its start (a GPU reaching its power cap, a CPU warming into its throttle, do so
after minutes, not proofs); its halves agree (no drift beyond their interval and half the
precision); its 95 % interval within ``precision`` on both estimates of its spread; and, with a
minimum rate, its verdict certain (the 99 % interval on one side of it).

**The batch is a floor for a moving or imprecise rate, not a ceiling.** At the batch the
stretch ends when the rate it will report (the part that holds still,
:func:`~cuzk_supervisor.core.benchrate.settled_start`) is known within ``precision`` at 99 % and
its verdict is certain; otherwise it goes on, up to ``most`` proofs, and ends as soon as both hold
(the budget bounds it all: then the result says how imprecise it is, and what it would take).

**Why stopping does not bend the rate.** A stretch ends on its spread and drift, never on
whether the rate is high or low: the minimum only decides whether it goes on past the batch. It
is stopped by closing it: proofs in flight finish and count, as a fixed batch's last ones do,
and the pipeline is never left underfed and then refilled.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from cuzk_supervisor.core.benchrate import rate_spread, settled_start, shifted, steady_rate_per_s
from cuzk_supervisor.core.checks import in_range, int_at_least, number_at_least, require_fields

PRECISION_CONFIDENCE = 0.95
"""The precision is the half-width of this two-sided interval, relative to the rate."""
VERDICT_CONFIDENCE = 0.99
"""A verdict is certain when this two-sided interval lies on one side of the minimum rate."""
SURE_CONFIDENCE = VERDICT_CONFIDENCE
"""Past its batch a stretch ends once this two-sided interval is within the precision, though
the rate reported states its 95 % one: a rule that looks at every completion stops where the
interval happens to be narrowest, and the margin keeps the 95 % claim true where it stops. An
early stop asks instead for the 95 % interval from the larger of two estimates of the spread
(:meth:`~cuzk_supervisor.core.benchrate.RateSpread.cautious_width`), which a lucky low one cannot
pass. bench/stop_stats.py measures both: the stated interval holds the truth in 96-100 % of the
runs of every scenario."""
MIN_COMPLETIONS = 5
"""Four intervals, whatever the floor: with one or two, intervals that happen to agree would
pass a noisy rate for a known one."""
RESOLUTION = 0.001
"""The narrowest relative half-width the verdict uses: completions stamped to the millisecond
do not tell rates closer than 0.1 % apart."""
TREND_ALLOWANCE = 0.5
"""The share of the halves' difference every uncertainty carries: under a steady trend the
whole's rate is that far from its latest half's. It covers moves too slow to tell from noise in
one stretch (a pipeline started from idle runs slow for a few dozen proofs while its partitions
fall out of step: 0.3-0.8 % in bench/_stopmodel.py at 5 % noise)."""
DRIFT_TOLERANCE = 0.5
"""Halves that differ by less than this share of the precision are not a moving machine: the
whole stretch's rate is then within a quarter of the precision of the latest half's."""


@dataclass(frozen=True, slots=True)
class StopRule:
    """What an adaptive stretch holds itself to (from ``BenchPolicy``)."""

    precision: float
    """The 95 % half-width the rate must reach; 0: off (the whole ``batch``, whatever it says)."""
    floor: int
    """Completions before anything stops the stretch early."""
    batch: int
    """Proofs submitted when the rate is known and still by then."""
    most: int
    """Proofs submitted at most while it is not."""
    min_rate_per_s: float = 0.0
    """The minimum rate on the completions' clock; 0: no verdict to wait for (a local run)."""
    soak_s: float = 0.0
    """Time on the completions' clock since the stretch began before any early stop."""

    def __post_init__(self) -> None:
        require_fields(self, ("precision",), in_range(0, 1, high_open=True))
        require_fields(self, ("floor", "batch", "most"), int_at_least(1))
        require_fields(self, ("min_rate_per_s", "soak_s"), number_at_least(0))

    @property
    def tolerance(self) -> float:
        return DRIFT_TOLERANCE * self.precision


@dataclass(frozen=True, slots=True)
class Knowledge:
    """What a stretch knows of the rate it would report now."""

    start: int
    """The first completion of the part that holds still (0: the whole stretch)."""
    proofs: int
    """Completions in that part."""
    rate_per_s: float | None
    half_width: float | None
    """95 %, relative, plus the part's own drift where the stretch drifted (None under four
    kept intervals)."""
    drifting: bool
    """The stretch's halves disagree: the machine moved while it was measured."""
    settled: bool
    """That part itself holds still (False: it drifts down to the floor)."""
    verdict: str
    """``above``, ``below``, ``too close`` or '' (no minimum, or no rate yet)."""
    sure_width: float | None = None
    """As ``half_width``, at :data:`SURE_CONFIDENCE`: what ending past the batch holds to."""
    early_width: float | None = None
    """As ``half_width``, from the larger of the two standard errors
    (:meth:`~cuzk_supervisor.core.benchrate.RateSpread.cautious_width`): what an early stop
    holds to."""

    def precise(self, precision: float) -> bool:
        return self.half_width is not None and self.half_width <= precision

    def sure(self, precision: float) -> bool:
        return self.sure_width is not None and self.sure_width <= precision

    def early(self, precision: float) -> bool:
        return self.early_width is not None and self.early_width <= precision

    def words(self) -> str:
        known = f"±{self.half_width:.2%}" if self.half_width is not None else "± unknown"
        moved = "" if not self.drifting else f", drifted: the last {self.proofs} hold still"
        if self.drifting and not self.settled:
            moved = f", still drifting over the last {self.proofs}"
        return f"rate {known} over {self.proofs} completions{moved}"


def knowledge(completions: Sequence[float], breaks: Collection[int], rule: StopRule) -> Knowledge:
    """What ``completions`` (with ``breaks``, :mod:`~cuzk_supervisor.core.benchrate`) know."""
    floor = max(rule.floor, MIN_COMPLETIONS)
    start = settled_start(completions, breaks, floor, rule.tolerance)
    part, part_breaks = completions[start:], shifted(breaks, start)
    whole = rate_spread(completions, breaks)
    spread = rate_spread(part, part_breaks) if start else whole
    rate = steady_rate_per_s(part, part_breaks)
    drifting = whole is not None and whole.drifting(rule.tolerance)
    settled = spread is None or not spread.drifting(rule.tolerance)
    half = sure = early = None
    if spread is not None:
        # What the part's own halves show it may still be moving counts against it: in full on
        # a machine that moved (the part's rate trails the end by about as much as its halves
        # differ), by TREND_ALLOWANCE where it did not.
        moved = abs(spread.drift) * (1.0 if drifting else TREND_ALLOWANCE)
        half = spread.half_width(PRECISION_CONFIDENCE) + moved
        sure = spread.half_width(SURE_CONFIDENCE) + moved
        early = spread.cautious_width(PRECISION_CONFIDENCE) + moved
    verdict = ""
    if rule.min_rate_per_s > 0 and rate is not None and sure is not None:
        wide = max(sure, RESOLUTION)
        if rate * (1 - wide) > rule.min_rate_per_s:
            verdict = "above"
        elif rate * (1 + wide) < rule.min_rate_per_s:
            verdict = "below"
        else:
            verdict = "too close"
    return Knowledge(start, len(part), rate, half, drifting, settled, verdict, sure, early)


@dataclass(frozen=True, slots=True)
class StopCall:
    stop: bool
    kind: str
    """Why it stops early: ``precision`` ('' while it goes on)."""
    reason: str
    limit: int
    """Proofs the stretch may submit in all, as things stand: ``batch`` once what it would
    report is known and its verdict certain, ``most`` while not."""


def stop_call(
    completions: Sequence[float],
    rule: StopRule,
    *,
    breaks: Collection[int] = (),
    elapsed_s: float = 0.0,
) -> StopCall:
    """Whether a stretch with ``completions`` (``elapsed_s`` since it began) stops submitting
    now, and how far it may go (see the module's text)."""
    if rule.precision <= 0:
        return StopCall(False, "", "", rule.batch)
    n, floor = len(completions), max(rule.floor, MIN_COMPLETIONS)
    if n < floor:
        return StopCall(False, "", f"below the floor ({n} of {floor} completions)", rule.most)
    known = knowledge(completions, breaks, rule)
    if known.rate_per_s is None or known.half_width is None:
        return StopCall(False, "", "no rate yet", rule.most)
    side = f", {known.verdict} the minimum at 99 %" if known.verdict in ("above", "below") else ""
    words = known.words() + side
    if known.verdict == "too close":
        return StopCall(False, "", f"too close to the minimum to tell: {words}", rule.most)
    # Past the batch it ends once the rate it would report is known at 99 %; an early stop asks
    # for 95 % on both estimates of the spread (a lucky low one is not trusted).
    limit = rule.batch if known.sure(rule.precision) and known.settled else rule.most
    if not known.settled:
        return StopCall(False, "", f"not yet settled: {words}", limit)
    if known.drifting:
        return StopCall(False, "", f"no early stop on a moving machine: {words}", limit)
    if not known.early(rule.precision):
        return StopCall(False, "", f"not yet within ±{rule.precision:.2%}: {words}", limit)
    if elapsed_s < rule.soak_s:
        why = f"soaking ({elapsed_s:.0f} of {rule.soak_s:.0f} s): {words}"
        return StopCall(False, "", why, limit)
    return StopCall(True, "precision", f"precision: {words}", rule.batch)
