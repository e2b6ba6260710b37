"""The manager's benchmark clock: where its budget ends, and whether one more measurement fits.

Pure: the clocks are read by the caller and passed in as numbers. The manager gives a benchmark
``budget_s`` seconds counted by its own clock, which starts when it acknowledges /param-done
(its ``param_done_at``); the supervisor keeps that start, in wall-clock seconds, in the state
file. Decisions are made on the monotonic clock, so the end of the budget is turned into a
monotonic deadline each time it is asked (the acknowledgement can arrive during the bench).
"""

from __future__ import annotations

from collections.abc import Sequence

from cuzk_supervisor.core.bench import BenchPolicy, Stretch, interval_estimate_s, measurement_fits

# A first use is slow: with nothing measured yet, the next proof is taken to last as long as
# the settle proof, and never less than this (a settle that took no time says nothing).
MIN_INTERVAL_S = 1e-3


def bench_deadline(
    *, now_monotonic: float, now_wall: float, clock_start: float | None, budget_s: float
) -> float:
    """The end of the manager's budget on the monotonic clock. ``clock_start`` is when the manager's
    clock started (wall-clock seconds), None while it has not acknowledged /param-done (the whole
    budget is still ahead)."""
    if clock_start is None:
        return now_monotonic + budget_s
    return now_monotonic + (clock_start + budget_s - now_wall)


def prompt_ack(queued_at: float | None, acked_at: float, within_s: float) -> bool:
    """Whether a /param-done queued at ``queued_at`` and acknowledged at ``acked_at`` (wall
    clock) was acknowledged promptly: within ``within_s`` (one request's time). The manager
    stamped it in between, so the queued time is then a start of its clock that is early
    (safe) by at most ``within_s``, with no need to read its record. Unknown (None), in the
    future or later than that: not prompt (look the stamp up)."""
    if queued_at is None:
        return False
    return 0.0 <= acked_at - queued_at <= within_s


def next_interval_s(stretches: Sequence[Stretch], settle_s: float) -> float:
    """The time one more proof is expected to add: from the latest stretch that measured one,
    else as slow as the settle proof (a first use of the configuration)."""
    for stretch in reversed(stretches):
        interval = interval_estimate_s(stretch)
        if interval is not None:
            return interval
    return max(settle_s, MIN_INTERVAL_S)


def room_to_measure(
    stretches: Sequence[Stretch], settle_s: float, remaining_s: float, policy: BenchPolicy
) -> bool:
    """Whether a new measurement (a settle proof, then a stretch of ``min_proofs``) fits the
    ``remaining_s`` of the budget after ``stretches`` were interrupted."""
    return measurement_fits(remaining_s, settle_s, next_interval_s(stretches, settle_s), policy)
