"""Virtual time for asyncio: an event loop whose clock jumps to its next timer whenever every
task is waiting on timers only, so an hour of a supervisor's life (or of a fleet of them) runs
in the CPU time it costs, through the product's own code and its one injected clock
(docs/architecture.md, rule 9: no patched ``time`` module).

- :class:`VirtualClock` is the clock: ``monotonic()`` (the loop's ``time()``) and ``time()``
  (a wall clock that moves with it). Hand ``clock.monotonic`` and ``clock.time`` to what
  takes a clock (the manager client, the log shipper, the reporter, the monitors).
- :class:`VirtualTimeLoop` is a selector loop on that clock. When it would block, it first
  polls its sockets; if nothing is ready it **jumps** to its next timer, unless ``busy()``
  says real work is under way outside the loop (a request in flight to a manager in another
  process, a thread's job): then it waits for real and the clock moves at the real rate, so a
  slow answer is as slow as it was and a timeout fires when it would have. Time never jumps
  while a request is in flight.
- The CPU time the loop's own callbacks take does not move the clock: many simulated
  machines in one process each behave as if they had a CPU of their own.

``run(coro)`` runs a coroutine on a new virtual loop (tests, the fleet benchmark).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClock", "VirtualTimeLoop", "run"]

T = TypeVar("T")


class VirtualClock:
    """Virtual monotonic seconds from ``start``; ``time()`` is the wall clock that goes with
    it (``wall_start`` at ``start``: the real wall clock when it was made, by default)."""

    def __init__(self, start: float = 0.0, wall_start: float | None = None) -> None:
        self.now = start
        self._wall_offset = (time.time() if wall_start is None else wall_start) - start
        self.jumped_s = 0.0
        """Seconds skipped by jumps (the rest passed at the real rate, waiting on I/O)."""
        self.real_waits_s = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self._wall_offset


class _Selector(selectors.DefaultSelector):
    def __init__(self, clock: VirtualClock, busy: Callable[[], bool]) -> None:
        super().__init__()
        self.clock = clock
        self.busy = busy

    def select(self, timeout: float | None = None) -> Any:
        if timeout is not None and timeout <= 0:
            return super().select(0)
        if not self.busy():
            events = super().select(0)
            if events or timeout is None:
                return events if events else self._real(None)
            self.clock.now += timeout
            self.clock.jumped_s += timeout
            return []
        return self._real(timeout)

    def _real(self, timeout: float | None) -> Any:
        started = time.monotonic()
        events = super().select(timeout)
        waited = time.monotonic() - started
        if timeout is not None:
            waited = min(waited, timeout)
        self.clock.now += waited
        self.clock.real_waits_s += waited
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a :class:`VirtualClock` (see the module docstring)."""

    def __init__(
        self, clock: VirtualClock | None = None, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        super().__init__(_Selector(self.clock, busy))

    def time(self) -> float:
        return self.clock.now


def run(
    coro: Coroutine[Any, Any, T],
    clock: VirtualClock | None = None,
    busy: Callable[[], bool] = lambda: False,
) -> T:
    """Run ``coro`` to its end on a new :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop(clock, busy)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
