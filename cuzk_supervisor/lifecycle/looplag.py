"""How late the supervisor's own event loop wakes, while a bench stretch runs.

The bench's rate depends on the supervisor submitting the next proof as soon as one ends; one
starved of CPU (a loaded host, a noisy neighbour, a blocking call) reacts late and the pipeline
idles, which no figure of the daemon's shows. A task sleeps ``interval_s`` at a time and keeps the
worst lateness of its wake-ups (``bench.stretch_done`` ``loop_lag_max_ms``), so a measurement
taken while the supervisor itself was starved can be told from a slow machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

from cuzk_supervisor.lifecycle.shared import cancel_and_wait

INTERVAL_S = 0.05
"""Between wake-ups: 20 a second, a few microseconds each."""


class LoopLag:
    """``async with LoopLag() as lag:`` ... ``lag.worst_s``: the worst lateness seen inside."""

    def __init__(
        self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"LoopLag.interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.worst_s = 0.0
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="loop-lag")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _watch(self) -> None:
        while True:
            due = self._clock() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.worst_s = max(self.worst_s, self._clock() - due)
