"""The benchmark's arithmetic (incidents I5, I6): when to stop submitting, and what rate to report.

Every bench decision lives here: the batch sized while it runs (:func:`next_submission`, with
the adaptive stop of :mod:`cuzk_supervisor.core.benchstop`), the rate (:func:`steady_rate_per_s`,
:func:`choose_measurement`, :func:`proofs_per_hour`).

Pure: every time is a number on one clock the caller chooses (monotonic seconds in the lifecycle,
simulated seconds in the tests); nothing here reads a clock or does I/O.

The batch is sized while it runs. It starts at the configured concurrency C (a cut batch must
measure the same pipeline), and at each completion :func:`next_submission` decides whether one
more proof still fits what is left of the budget. The rate is the pipeline's throughput while it
is full (:func:`steady_rate_per_s`), measured on one *stretch*: a run of the pipeline at one plan
that no daemon restart interrupted. A restart inside the bench ends the stretch; the lifecycle
settles again and starts a new one if :func:`measurement_fits`, and :func:`choose_measurement`
picks the stretch the rate comes from.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cuzk_supervisor.core.benchstop import PRECISION_CONFIDENCE, StopRule, rate_spread, stop_call
from cuzk_supervisor.core.checks import (
    in_range,
    int_at_least,
    number_at_least,
    require,
    require_fields,
)

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class BenchPolicy:
    """The benchmark's limits (settings ``bench_count``, ``bench_concurrency``,
    ``bench_safety``, ``bench_min_proofs``, ``bench_precision``, ``bench_max_proofs``; the
    minimum rate is the one sent to /register)."""

    max_proofs: int = 12
    """Proofs one stretch submits (the batch), unless the adaptive stop ends it sooner or, near
    ``min_rate``, lets it go on to ``most_proofs``."""
    concurrency: int = 2
    """Proofs kept in flight."""
    safety: float = 1.25
    """Estimated times are stretched by this before they are compared with the budget."""
    min_proofs: int = 3
    """Completions a stretch needs for its rate to count as a measurement; the adaptive stop's
    floor too."""
    precision: float = 0.0
    """Adaptive stop: end the stretch once its rate is known within this fraction (95 %), its
    verdict against ``min_rate`` certain; go on past the batch while the verdict is not
    (:mod:`~cuzk_supervisor.core.benchstop`); 0: the whole batch."""
    most_proofs: int = 0
    """Adaptive stop: most proofs a stretch submits while its rate is too close to ``min_rate``
    to tell (never fewer than ``max_proofs``; the budget still bounds it)."""
    min_rate: float = 0.0
    """Proofs per hour on the stretch's clock (the reported minimum times ``rate_time_scale``);
    0: no verdict to wait for (a local run)."""

    def __post_init__(self) -> None:
        require_fields(self, ("max_proofs", "concurrency"), int_at_least(1))
        require_fields(self, ("safety",), number_at_least(1))
        require_fields(self, ("min_proofs",), int_at_least(2))
        require_fields(self, ("most_proofs",), int_at_least(0))
        require_fields(self, ("min_rate",), number_at_least(0))
        require_fields(self, ("precision",), in_range(0, 1, high_open=True))

    @property
    def stop_rule(self) -> StopRule:
        return StopRule(
            precision=self.precision, floor=self.min_proofs, batch=self.max_proofs,
            most=max(self.max_proofs, self.most_proofs), min_rate_per_s=self.min_rate / HOUR_S,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Stretch:
    """One uninterrupted run of the pipeline at one plan: when it began, when each proof ended."""

    workers: int
    concurrency: int
    started_at: float
    """When its first proof was submitted."""
    completions: tuple[float, ...] = ()
    """When each proof completed, ascending (failed proofs are not throughput and not here)."""
    submitted: int = 0
    failed: int = 0
    """Proofs that ended FAILED: no longer in flight, not throughput."""
    interrupted: str = ""
    """Why it ended before its last proof ('' when it ran to its end)."""
    stalls: tuple[float, ...] = ()
    """Completions we heard of late (a stalled connection): the pipeline went underfed after
    each, so the stretch is measured in the pieces between them (:func:`split_at_stalls`)."""
    closed: str = ""
    """Why submitting ended for good ('' while it may go on): once one more proof did not fit
    the budget, none goes in later, even where a later (lower) interval estimate would let it,
    because a pipeline refilled after it drained repeats the fill and ends late."""
    stop: str = ""
    """Why submitting ended, in one word: ``precision``, ``verdict-certain``,
    ``batch-complete``, ``max-proofs`` (too close to the minimum to tell to the end) or
    ``budget``; '' while it may go on."""

    def __post_init__(self) -> None:
        ascending = all(b >= a for a, b in itertools.pairwise(self.completions))
        require(ascending, "Stretch", "completions", self.completions, "ascending")

    def completed(self, at: float, *, heard_late: bool = False) -> Stretch:
        """One more completion at ``at``; kept in time order (two results seen in one wake-up
        may arrive in either order). ``heard_late``: its successor was submitted late."""
        done = list(self.completions)
        bisect.insort(done, at)
        stalls = (*self.stalls, at) if heard_late else self.stalls
        return _replace(self, completions=tuple(done), stalls=stalls)

    def submitted_one(self) -> Stretch:
        return _replace(self, submitted=self.submitted + 1)

    def failed_one(self) -> Stretch:
        return _replace(self, failed=self.failed + 1)

    def close(self, why: str, stop: str = "") -> Stretch:
        return _replace(self, closed=why, stop=stop)

    @property
    def measuring(self) -> tuple[float, ...]:
        """The completions since the last one heard late (the piece being measured now)."""
        if not self.stalls:
            return self.completions
        last = max(self.stalls)
        return tuple(t for t in self.completions if t > last)

    @property
    def measuring_submitted(self) -> int:
        """Proofs submitted for the piece being measured now: all of them, less those that
        completed up to the last one heard late (the ones in flight then complete in it)."""
        if not self.stalls:
            return self.submitted
        last = max(self.stalls)
        return self.submitted - sum(1 for t in self.completions if t <= last)

    def interrupt(self, why: str) -> Stretch:
        return _replace(self, interrupted=why)

    @property
    def in_flight(self) -> int:
        return self.submitted - len(self.completions) - self.failed


def _replace(stretch: Stretch, **changes: Any) -> Stretch:
    return dataclasses.replace(stretch, **changes)


def steady_rate_per_s(completions: Sequence[float]) -> float | None:
    """Throughput of a full pipeline, in proofs per second, from its completion times.

    The least-squares slope of the completion count against time::

        rate = Σ (k − k̄)(t_k − t̄) / Σ (t_k − t̄)²      over the completions t_1 … t_n

    The fill before the first completion is left out, as the time origin is never used. Every
    completion weighs the same, so the lumpy pattern of a partition pipeline (intervals that
    alternate with the partition rounds) and the drain's last few completions average out
    instead of deciding the figure, as the two end points alone would. Against the simulator's
    model (``sim.pipeline.simulate_closed_loop``) it is exact when the workers divide the 10
    partitions (1, 2, 5, 10) and within a few per cent for batches of 10 or more otherwise;
    tests/test_core_bench.py holds the figures. None with fewer than two completions.
    """
    n = len(completions)
    if n < 2:
        return None
    mean_k = (n - 1) / 2
    mean_t = sum(completions) / n
    var_t = sum((t - mean_t) ** 2 for t in completions)
    if var_t <= 0:
        return None  # all at the same instant: no interval to measure
    cov = sum((k - mean_k) * (t - mean_t) for k, t in enumerate(completions))
    return cov / var_t


def interval_estimate_s(stretch: Stretch) -> float | None:
    """Seconds between completions when the pipeline is full, as far as ``stretch`` shows it.

    From two completions on, the steady interval; with one, that proof's own latency (its
    time from submission, an overestimate of the interval: safe for sizing); None before.
    """
    rate = steady_rate_per_s(stretch.completions)
    if rate is not None and rate > 0:
        return 1.0 / rate
    if stretch.completions:
        return max(stretch.completions[0] - stretch.started_at, 1e-9)
    return None


@dataclass(frozen=True, slots=True)
class SubmitDecision:
    submit: bool
    reason: str
    closes: bool = False
    """The stretch submits nothing more (:meth:`Stretch.close` it with the reason)."""
    stop: str = ""
    """With ``closes``: why, in one word (:attr:`Stretch.stop`)."""


def next_submission(
    stretch: Stretch, now: float, deadline: float, policy: BenchPolicy
) -> SubmitDecision:
    """Whether to submit one more proof now, with ``deadline`` the end of the budget.

    The batch counts the proofs of the piece being measured (:attr:`Stretch.measuring`): after
    a completion heard late the rate is measured afresh, on a batch of its own.

    The first ``concurrency`` proofs always go (at least one proof runs, and a cut batch keeps
    its concurrency). After that the adaptive stop (``policy.precision``; :func:`~cuzk_supervisor.
    core.benchstop.stop_call`) may end the stretch, or extend it past the batch while the rate is
    too close to ``min_rate``; then a proof submitted now finishes about ``concurrency``
    intervals later, when the ones ahead of it are done; it is submitted only if that, times
    ``safety``, ends before the deadline. Proofs in flight always finish. Whatever ends the
    submitting closes the stretch (:attr:`Stretch.closed`, :attr:`Stretch.stop`): a pipeline
    left to drain is never refilled.
    """
    concurrency = min(policy.concurrency, policy.max_proofs)
    if stretch.closed:
        return SubmitDecision(False, stretch.closed)
    if stretch.in_flight >= concurrency:
        return SubmitDecision(False, f"{concurrency} in flight")
    measuring = stretch.measuring
    # A completion heard late starts a new piece (the rate comes from one piece): its batch is
    # counted afresh, or a stall late in the batch leaves a few proofs to measure the rate on.
    submitted = stretch.measuring_submitted
    call = stop_call(measuring, steady_rate_per_s(measuring), policy.stop_rule)
    if call.stop:
        # Past the batch it went on only because the verdict was in doubt: that ended it.
        kind = "verdict-certain" if submitted > policy.max_proofs else call.kind
        return SubmitDecision(False, call.reason, closes=True, stop=kind)
    if submitted >= call.limit:
        if call.limit > policy.max_proofs:
            kind = "max-proofs"  # still too close to the minimum to tell
        elif submitted > policy.max_proofs:
            kind = "verdict-certain"  # it went on past the batch until it could tell
        else:
            kind = "batch-complete"
        why = f"all {call.limit} proofs submitted" + (f" ({call.reason})" if call.reason else "")
        return SubmitDecision(False, why, closes=True, stop=kind)
    if stretch.submitted < concurrency:
        return SubmitDecision(True, f"filling the pipeline ({stretch.submitted + 1}/{concurrency})")
    interval = interval_estimate_s(stretch)
    if interval is None:
        return SubmitDecision(False, "waiting for a completion to estimate the interval")
    finish = now + concurrency * interval * policy.safety
    if finish <= deadline:
        return SubmitDecision(True, f"fits: about {finish - now:.1f} s of {deadline - now:.1f} s")
    return SubmitDecision(
        False,
        f"budget: one more needs about {concurrency} x {interval:.1f} s x {policy.safety:g} = "
        f"{finish - now:.1f} s, {max(0.0, deadline - now):.1f} s left",
        closes=True,
        stop="budget",
    )


def planned_proofs(stretch: Stretch, policy: BenchPolicy) -> int:
    """Proofs the stretch submits in all as things stand (for progress): the batch, counted
    from the piece being measured, or what was submitted where it went on past that."""
    earlier = stretch.submitted - stretch.measuring_submitted
    return max(earlier + policy.max_proofs, stretch.submitted)


def measurement_fits(
    remaining_s: float, settle_s: float, interval_s: float, policy: BenchPolicy
) -> bool:
    """Whether a new measurement (a settle proof, then a stretch of ``min_proofs``) fits the
    ``remaining_s`` of the budget, with the safety factor."""
    concurrency = min(policy.concurrency, policy.max_proofs)
    needed = settle_s + (concurrency + policy.min_proofs - 1) * interval_s
    return needed * policy.safety <= remaining_s


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
    """Half-width of the rate's 95 % interval, relative to it (None under three completions;
    :func:`~cuzk_supervisor.core.benchstop.rate_spread`)."""
    drift: float | None = None
    """The latest half's rate over the whole's, minus 1."""

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
            "uncertainty_pct": (
                round(self.uncertainty * 100, 3) if self.uncertainty is not None else None
            ),
            "drift_pct": round(self.drift * 100, 3) if self.drift is not None else None,
        }


def _rate_of(stretch: Stretch) -> tuple[float, float]:
    """(proofs per hour, interval) of a stretch with at least one completion."""
    done = stretch.completions
    rate = steady_rate_per_s(done)
    if rate is not None:
        return rate * HOUR_S, done[-1] - done[0]
    latency = max(done[0] - stretch.started_at, 1e-9)
    return HOUR_S / latency, latency


def late_hearing_s(stretch: Stretch) -> float:
    """How late a completion may be heard before the pipeline counts as underfed: a quarter of
    the interval (infinite until an interval is known)."""
    rate = steady_rate_per_s(stretch.completions)
    return 0.25 / rate if rate is not None and rate > 0 else math.inf


def split_at_stalls(stretch: Stretch) -> list[Stretch]:
    """The stretch cut after each completion heard late: the pieces in between measured a full
    pipeline; the time the client could not feed it is not the machine's throughput."""
    if not stretch.stalls:
        return [stretch]
    pieces: list[Stretch] = []
    start, rest = stretch.started_at, list(stretch.completions)
    for stall in sorted(stretch.stalls):
        head = [t for t in rest if t <= stall]
        rest = [t for t in rest if t > stall]
        if head:
            pieces.append(dataclasses.replace(
                stretch, started_at=start, completions=tuple(head), submitted=len(head),
                failed=0, interrupted="connection stalled", stalls=(),
            ))  # fmt: skip
            start = head[-1]
    pieces.append(dataclasses.replace(
        stretch, started_at=start, completions=tuple(rest), submitted=len(rest), failed=0,
        stalls=(),
    ))  # fmt: skip
    return pieces


def choose_measurement(stretches: Sequence[Stretch], policy: BenchPolicy) -> RateMeasurement:
    """The rate to report from the bench's stretches (the last one is the current plan's).

    1. The last stretch, when it ran to its end with ``min_proofs`` completions: the normal case.
    2. Else the longest stretch at the current plan with ``min_proofs`` completions, uninterrupted
       while it lasted (an interrupted stretch's completions before the restart still measured a
       full pipeline; the proofs lost in the restart are not counted).
    3. Else what was measured, marked short: the stretch with the most completions (a rate from
       two or more, else one proof's latency); rate 0 when no proof completed.
    """
    excluded = tuple(s.interrupted for s in stretches if s.interrupted)
    if not stretches:
        return RateMeasurement(0.0, 0, 0.0, policy.concurrency, 0, False, "no proof ran")

    def measured(stretch: Stretch, steady: bool, label: str, tail: str = "") -> RateMeasurement:
        rate, span = _rate_of(stretch) if stretch.completions else (0.0, 0.0)
        n = len(stretch.completions)
        noun = "proofs" if steady else "proof(s)"
        reason = f"{label}: {n} {noun} over {span:.1f} s{tail}" if n else label
        spread = rate_spread(stretch.completions)
        return RateMeasurement(
            rate, n, span, stretch.concurrency, stretch.workers, steady, reason,
            stretches=len(stretches), excluded=excluded,
            stopped=stretch.stop or ("interrupted" if stretch.interrupted else ""),
            uncertainty=spread.half_width(PRECISION_CONFIDENCE) if spread else None,
            drift=spread.drift if spread else None,
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


# --- the plain rate -------------------------------------------------------------------------


def proofs_per_hour(completed: int, wall_s: float) -> float:
    """The benchmark rate: completed proofs / wall-clock seconds × 3600 (0 when nothing ran)."""
    if completed <= 0 or wall_s <= 0:
        return 0.0
    return completed / wall_s * 3600.0
