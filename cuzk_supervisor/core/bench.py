"""The benchmark's arithmetic (incidents I5, I6): the batch sized while it runs.

The adaptive stop is :mod:`cuzk_supervisor.core.benchstop`, the rate and its uncertainty
:mod:`cuzk_supervisor.core.benchrate`, the rate reported :mod:`cuzk_supervisor.core.benchreport`.
Pure: every time is a number on one clock the caller chooses (monotonic seconds in the lifecycle,
the daemon's own finishing times on it; simulated seconds in the tests).

The batch starts at the configured concurrency C (a cut batch must measure the same pipeline), and
at each completion :func:`next_submission` decides whether one more proof still fits what is left of
the budget. The rate is measured on one *stretch*: a run of the pipeline at one plan that no daemon
restart, step-down or plan change interrupted. Only those end a stretch (the machine changed); a
proof submitted late (its predecessor heard late on a dropped connection, a supervisor starved of
CPU) does not: the one interval its wait can sit in is left out (:attr:`Stretch.breaks`).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from dataclasses import dataclass, replace

from cuzk_supervisor.core.benchrate import cycle, seconds_per_proof
from cuzk_supervisor.core.benchrate import steady_rate_per_s as steady_rate_per_s
from cuzk_supervisor.core.benchstop import StopRule, stop_call
from cuzk_supervisor.core.checks import (
    in_range,
    int_at_least,
    number_at_least,
    require,
    require_fields,
)

HOUR_S = 3600.0
LATE_SHARE = 0.1
"""A proof submitted later than this share of the interval after the completion it replaces is
submitted late (:attr:`Stretch.breaks`): the pipeline may have idled for it. Below it, the
worst a late resubmission can bend a batch of n proofs is 0.1/n."""


@dataclass(frozen=True, slots=True)
class BenchPolicy:
    """The benchmark's limits (settings ``bench_count``, ``bench_concurrency``,
    ``bench_safety``, ``bench_min_proofs``, ``bench_precision``, ``bench_max_proofs``,
    ``bench_min_soak_s``; the minimum rate is the one sent to /register)."""

    max_proofs: int = 12
    """Proofs one stretch submits (the batch), unless the adaptive stop ends it sooner or lets
    it go on to ``most_proofs`` while the rate it would report is not known."""
    concurrency: int = 2
    """Proofs kept in flight."""
    queue_ahead: int = 2
    """Proofs kept submitted beyond ``concurrency``, waiting in the daemon's own queue: when a
    proof ends the next is already there, so a late answer, a reset connection or a starved loop
    of ours does not leave the daemon idle (issue 42: with one, a supervisor reading 50,000 log
    lines a second still left a 12-worker daemon idle 7 % of the bench and cost 2.4 %; with two,
    none; bench/supervisor_delays.py). The daemon admits partitions by its workers (or memory
    budget), not by jobs queued (docs/daemon.md), so this costs only their inputs' memory."""
    safety: float = 1.25
    """Estimated times are stretched by this before they are compared with the budget."""
    min_proofs: int = 3
    """Completions a stretch needs to count as a measurement; the adaptive stop's floor too."""
    precision: float = 0.0
    """Adaptive stop: the rate reported must be known within this fraction (95 %): it ends the
    stretch early once it is (after ``min_soak_s``, on a machine that holds still) and makes it go
    on past the batch while it is not (:mod:`~cuzk_supervisor.core.benchstop`); 0: the batch."""
    most_proofs: int = 0
    """Adaptive stop: most proofs a stretch submits while the rate is not known (never fewer
    than ``max_proofs``; the budget still bounds it)."""
    min_rate: float = 0.0
    """Proofs per hour on the stretch's clock (the reported minimum times ``rate_time_scale``);
    0: no verdict to wait for (a local run)."""
    min_soak_s: float = 0.0
    """Seconds on the stretch's clock from its start before any early stop (the daemon's
    ``bench_min_soak_s`` divided by ``rate_time_scale``)."""

    def __post_init__(self) -> None:
        require_fields(self, ("max_proofs", "concurrency"), int_at_least(1))
        require_fields(self, ("safety",), number_at_least(1))
        require_fields(self, ("min_proofs",), int_at_least(2))
        require_fields(self, ("most_proofs", "queue_ahead"), int_at_least(0))
        require_fields(self, ("min_rate", "min_soak_s"), number_at_least(0))
        require_fields(self, ("precision",), in_range(0, 1, high_open=True))

    @property
    def held(self) -> int:
        """Proofs the daemon holds (running or queued) while full: the stretch's ``concurrency``."""
        return min(self.concurrency + self.queue_ahead, self.max_proofs)

    @property
    def stop_rule(self) -> StopRule:
        return StopRule(
            precision=self.precision, floor=self.min_proofs, batch=self.max_proofs,
            most=max(self.max_proofs, self.most_proofs), min_rate_per_s=self.min_rate / HOUR_S,
            soak_s=self.min_soak_s,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Stretch:
    """One uninterrupted run of the pipeline at one plan: when it began, when each proof ended."""

    workers: int
    concurrency: int
    """Proofs kept submitted (:attr:`BenchPolicy.held`: in flight and queued ahead)."""
    started_at: float
    """When its first proof was submitted."""
    completions: tuple[float, ...] = ()
    """When each proof completed, ascending (failed proofs are not throughput and not here)."""
    submitted: int = 0
    failed: int = 0
    """Proofs that ended FAILED: no longer in flight, not throughput."""
    interrupted: str = ""
    """Why it ended before its last proof ('' when it ran to its end)."""
    fed: tuple[float, ...] = ()
    """When each proof was submitted, in order (the first ``concurrency`` fill the pipeline; each
    later one replaces the completion ``concurrency`` before it); once its result is in, when the
    submit attempt that carried it began (:meth:`landed`: a submit cut and made again goes in
    later). Not when that attempt was answered: the upload's own time is no lateness of the
    supervisor's, and at a high time scale it would make every submission look late and leave
    out every longer interval of a lumpy pipeline (+15 % on a 7-worker one whose uploads took
    40 ms at time scale 200)."""
    closed: str = ""
    """Why submitting ended for good ('' while it may go on): none goes in later, even where a
    lower interval estimate would let it: a pipeline refilled after it drained ends late."""
    stop: str = ""
    """Why submitting ended, in one word: ``precision``, ``batch-complete``, ``known``,
    ``max-proofs`` or ``budget`` (:func:`next_submission`); '' while it may go on."""

    def __post_init__(self) -> None:
        ascending = all(b >= a for a, b in itertools.pairwise(self.completions))
        require(ascending, "Stretch", "completions", self.completions, "ascending")

    def completed(self, at: float) -> Stretch:
        """One more completion at ``at``, in time order (two results seen in one wake-up may
        arrive in either order)."""
        done = list(self.completions)
        bisect.insort(done, at)
        return replace(self, completions=tuple(done))

    def submitted_one(self, at: float | None = None) -> Stretch:
        """One more proof submitted (at ``at``, on the completions' clock, where known)."""
        fed = (*self.fed, at) if at is not None else self.fed
        return replace(self, submitted=self.submitted + 1, fed=fed)

    def landed(self, index: int, at: float | None) -> Stretch:
        """Proof ``index`` (by submission) went in by the attempt begun at ``at``, if known."""
        if at is None or not 0 <= index < len(self.fed):
            return self
        fed = list(self.fed)
        fed[index] = max(fed[index], at)
        return replace(self, fed=tuple(fed))

    def failed_one(self) -> Stretch:
        return replace(self, failed=self.failed + 1)

    def close(self, why: str, stop: str = "") -> Stretch:
        return replace(self, closed=why, stop=stop)

    def interrupt(self, why: str) -> Stretch:
        return replace(self, interrupted=why)

    @property
    def in_flight(self) -> int:
        return self.submitted - len(self.completions) - self.failed

    @property
    def late(self) -> tuple[int, ...]:
        """The proofs (by submission) that went in late: more than :data:`LATE_SHARE` of the
        interval after the completion each replaced (the one ``concurrency`` places before it)."""
        return tuple(self._lateness())

    def _lateness(self) -> dict[int, float]:
        """How late each late proof (by submission) went in, in seconds (:attr:`late`)."""
        done, c = self.completions, self.concurrency
        if len(done) < 2 or len(self.fed) <= c:
            return {}
        spp = seconds_per_proof(done)
        if spp is None:
            return {}
        waits = {j: self.fed[j] - done[j - c] for j in range(c, len(self.fed)) if j - c < len(done)}
        return {j: wait for j, wait in waits.items() if wait > LATE_SHARE * spp}

    @property
    def breaks(self) -> frozenset[int]:
        """The intervals left out of the rate (:mod:`~cuzk_supervisor.core.benchrate`; interval
        ``i`` ends at completion ``i``): a proof submitted late finishes as the completion of its
        own rank (the partitions of the proofs already in flight go first); where the pipeline had
        no slack the wait is in the interval that ends there, which is then longer than the usual
        ones (:data:`INFLATED_SDS`, :data:`INFLATED_SHARE`). Where it had slack (the other proofs
        in flight kept the partitions busy), the interval is as usual and counts."""
        done = self.completions
        drain = self.drained
        if len(done) < 3:
            return drain
        gaps = [b - a for a, b in itertools.pairwise(done)]
        usual = statistics.median(gaps)
        # Longer than usual beyond the intervals' own spread (a robust one: their median
        # absolute deviation, as a standard deviation), and by INFLATED_SHARE at least.
        spread = 1.4826 * statistics.median(abs(g - usual) for g in gaps)
        longer = usual + max(INFLATED_SDS * spread, INFLATED_SHARE * usual)
        # The wait a late submission puts in an interval is at most its lateness: an interval
        # longer than that is long for another reason and counts (a pipeline whose workers do not
        # divide the partitions runs in lumps by design, docs/daemon.md (figures)).
        slack = INFLATED_SHARE * usual
        return drain | {
            j
            for j, wait in self._lateness().items()
            if j < len(done) and longer < gaps[j - 1] <= usual + wait + slack
        }

    @property
    def drained(self) -> frozenset[int]:
        """The intervals of a lumpy pipeline's drain, left out of the rate. Once submitting ends, a
        completion is no longer replaced and the interval after it runs with fewer than
        ``concurrency`` proofs in flight: the last proof's partitions share the machine with fewer
        others (docs/daemon.md (figures)) and break the cycle of a pipeline whose workers do not
        divide the partitions, whose rate is measured over whole cycles
        (:func:`~cuzk_supervisor.core.benchrate.cycle`): on the simulator a 7-worker stretch stopped
        'known' at ±0.55 % and reported ±2.5 % with its drain. A pipeline without a cycle keeps it:
        there the drain is one more interval like the others, and leaving it out lost more than it
        saved (the statistical bench's 5 %-noise scenario covered the truth in 94.0 % of 1,000 runs
        without it, 96.5 % with it). Interval ``i`` is the drain's when completion ``i - 1`` was
        never replaced (a failed proof's replacement counts as a completion's, so with failures the
        drain starts earlier, never later). A stretch with fewer than :data:`STEADY_BEFORE_DRAIN`
        intervals before its drain keeps it (its rate says it is short or imprecise)."""
        first = max(1, self.submitted - self.concurrency - self.failed + 1)
        if first - 1 < STEADY_BEFORE_DRAIN or first >= len(self.completions):
            return frozenset()
        steady = [b - a for a, b in itertools.pairwise(self.completions[:first])]
        if cycle(steady) == 1:
            return frozenset()
        return frozenset(range(first, len(self.completions)))


STEADY_BEFORE_DRAIN = 2
"""Intervals with every completion replaced a stretch needs before its drain is left out."""
INFLATED_SDS = 3.0
INFLATED_SHARE = 0.02
"""An interval is held up (:attr:`Stretch.breaks`) when it is longer than the median by these
many robust standard deviations of the intervals, and by this share at least."""


def interval_estimate_s(stretch: Stretch) -> float | None:
    """Seconds between completions when the pipeline is full, as far as ``stretch`` shows it:
    from two completions on, the steady interval; with one, that proof's own latency (an
    overestimate of the interval: safe for sizing); None before."""
    rate = steady_rate_per_s(stretch.completions, stretch.breaks)
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

    The first :attr:`BenchPolicy.held` proofs (``concurrency`` and those queued ahead) always go
    (at least one proof runs, and a cut batch keeps its concurrency). After that the adaptive
    stop (``policy.precision``; :func:`~cuzk_supervisor.core.benchstop.stop_call`) may end the
    stretch early, or extend it past the batch while the rate it would report is not known;
    then a proof submitted now finishes about ``held`` intervals later, when the ones ahead of
    it are done; it is submitted only if that, times ``safety``, ends before the deadline. Proofs
    in flight always finish. Whatever ends the submitting closes the stretch
    (:attr:`Stretch.closed`, :attr:`Stretch.stop`): a pipeline left to drain is never refilled."""
    concurrency = policy.held
    if stretch.closed:
        return SubmitDecision(False, stretch.closed)
    if stretch.in_flight >= concurrency:
        return SubmitDecision(False, f"{concurrency} in flight")
    submitted = stretch.submitted
    elapsed_s = now - stretch.started_at
    call = stop_call(
        stretch.completions, policy.stop_rule, breaks=stretch.breaks, elapsed_s=elapsed_s
    )
    if call.stop:
        kind = "known" if submitted > policy.max_proofs else call.kind
        return SubmitDecision(False, call.reason, closes=True, stop=kind)
    if submitted >= call.limit:
        if call.limit > policy.max_proofs:
            kind = "max-proofs"  # still not known
        elif submitted > policy.max_proofs:
            kind = "known"  # it went on past the batch until it was
        else:
            kind = "batch-complete"
        why = f"all {call.limit} proofs submitted" + (f" ({call.reason})" if call.reason else "")
        return SubmitDecision(False, why, closes=True, stop=kind)
    if submitted < concurrency:
        return SubmitDecision(True, f"filling the pipeline ({submitted + 1}/{concurrency})")
    interval = interval_estimate_s(stretch)
    if interval is None:
        return SubmitDecision(False, "waiting for a completion to estimate the interval")
    finish = now + concurrency * interval * policy.safety
    if finish <= deadline:
        return SubmitDecision(True, f"fits: about {finish - now:.1f} s of {deadline - now:.1f} s")
    why = (
        f"budget: one more needs about {concurrency} x {interval:.1f} s x {policy.safety:g} = "
        f"{finish - now:.1f} s, {max(0.0, deadline - now):.1f} s left"
    )
    return SubmitDecision(False, why, closes=True, stop="budget")


def planned_proofs(stretch: Stretch, policy: BenchPolicy) -> int:
    """Proofs the stretch submits in all as things stand (for progress): the batch, or what
    was submitted where it went on past that."""
    return max(policy.max_proofs, stretch.submitted)


def measurement_fits(
    remaining_s: float, settle_s: float, interval_s: float, policy: BenchPolicy
) -> bool:
    """Whether a new measurement (a settle proof, then a stretch of ``min_proofs``) fits the
    ``remaining_s`` of the budget, with the safety factor."""
    needed = settle_s + (policy.held + policy.min_proofs - 1) * interval_s
    return needed * policy.safety <= remaining_s


def proofs_per_hour(completed: int, wall_s: float) -> float:
    """The benchmark rate: completed proofs / wall-clock seconds × 3600 (0 when nothing ran)."""
    if completed <= 0 or wall_s <= 0:
        return 0.0
    return completed / wall_s * 3600.0
