"""Simulated time on the event loop's monotonic clock: ``scale`` simulated seconds per real
second, counted from when the clock was made."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class SimClock:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()

    def now(self) -> float:
        return self.at(self._loop.time())

    def at(self, loop_time: float) -> float:
        """The simulated time of a moment on the loop's clock."""
        return (loop_time - self._t0) * self.scale

    def call_at(
        self, t: float, callback: Callable[..., None], *args: object
    ) -> asyncio.TimerHandle:
        """Run ``callback(*args)`` at simulated time ``t`` (at once if that has passed)."""
        return self._loop.call_at(self._t0 + t / self.scale, callback, *args)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.scale)
