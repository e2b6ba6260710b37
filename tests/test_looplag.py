"""The bench's loop-lag watch: how late the supervisor's own event loop woke while it ran."""

from __future__ import annotations

import asyncio

import pytest
from simhelpers import apoll_until

from cuzk_supervisor.lifecycle.looplag import LoopLag


class Clock:
    """A monotonic clock the test moves: a jump is a wake-up that came that much later. It
    counts its reads, so the test can wait for the watch's wake-ups instead of sleeping."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    async def read_at_least(self, reads: int) -> None:
        async def enough() -> bool:
            return self.reads >= reads

        await apoll_until(enough, 5, interval=0.001, what=f"{reads} clock reads")


async def test_a_late_wake_up_is_the_lag_and_the_worst_is_kept() -> None:
    clock = Clock()
    async with LoopLag(interval_s=0.01, clock=clock) as lag:
        await clock.read_at_least(1)  # the watch has read the clock and sleeps
        clock.now += 0.25  # it wakes 0.24 s after it was due
        await clock.read_at_least(3)  # that wake-up judged, the next one due
        assert lag.worst_s == pytest.approx(0.24)
        clock.now += 0.01  # the next wake-up on time does not lower the figure
        await clock.read_at_least(5)
    assert lag.worst_s == pytest.approx(0.24)


async def test_leaving_the_block_stops_the_watch() -> None:
    clock = Clock()
    async with LoopLag(interval_s=0.01, clock=clock) as lag:
        await clock.read_at_least(1)
    assert all(task.get_name() != "loop-lag" for task in asyncio.all_tasks())
    assert lag.worst_s == 0


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        LoopLag(interval_s=0)
