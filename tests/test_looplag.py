"""The bench's loop-lag watch: how late the supervisor's own event loop woke while it ran."""

from __future__ import annotations

import asyncio

import pytest
from simhelpers import apoll_until

from cuzk_supervisor.lifecycle.looplag import LoopLag


class Clock:
    """A monotonic clock the test moves: a jump is a wake-up that came that much later."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_late_wake_up_is_the_lag_and_the_worst_is_kept() -> None:
    clock = Clock()
    async with LoopLag(interval_s=0.01, clock=clock) as lag:

        async def seen() -> bool:
            return lag.worst_s > 0

        await asyncio.sleep(0)  # the watch has read the clock and sleeps
        clock.now += 0.25  # it wakes 0.24 s after it was due
        await apoll_until(seen, 5, what="the late wake-up seen")
        assert lag.worst_s == pytest.approx(0.24)
        clock.now += 0.01  # a wake-up on time after it does not lower the figure
        await asyncio.sleep(0.05)
    assert lag.worst_s == pytest.approx(0.24)


async def test_leaving_the_block_stops_the_watch() -> None:
    async with LoopLag(interval_s=0.01) as lag:
        await asyncio.sleep(0)
    assert all(task.get_name() != "loop-lag" for task in asyncio.all_tasks())
    assert lag.worst_s >= 0


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        LoopLag(interval_s=0)
