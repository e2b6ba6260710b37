"""What the probes report, apart from HTTP: :class:`HealthSource` (phase, daemon readiness,
last failure; ``/readyz``; the lifecycle's is ``lifecycle.machine.LifecycleSource``);
:class:`StartupLatch`, which passes once the slow start is over (``/startupz``); and
:class:`Heartbeat`, how late the event loop runs (``/healthz``).

Liveness, startup and readiness are kept apart, as the kubelet does: ``/healthz`` only says the
event loop is turning (a slow warmup is not a dead supervisor), ``/startupz`` says the slow start
(params, plan, warmup) is over, ``/readyz`` says the instance is proving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

# The phases after warmup: entering one means the daemon answered proofs after the slow start
# (params fetched, plan made, PCE built), which is what /startupz reports.
# "finished": a terminal verdict stands (nothing more will start); /readyz says why.
STARTUP_PASSED_PHASES = frozenset({"restart", "settle", "bench", "report", "run", "finished"})


class HealthSource(Protocol):
    """What ``/readyz`` reports. Read-only properties: plain attributes satisfy it too."""

    @property
    def phase(self) -> str: ...

    @property
    def daemon_ready(self) -> bool: ...

    @property
    def last_failure(self) -> str: ...


class StartupLatch:
    """Passes once the lifecycle enters a phase after warmup, and never turns back.

    Fed by the lifecycle's ``phase_listeners`` (``latch.on_phase``). A restarted supervisor that
    resumes straight into the run phase (the benchmark was already reported) passes on entering
    it, after its daemon answered the readiness check.
    """

    def __init__(self) -> None:
        self.passed = False

    def on_phase(self, phase: str) -> None:
        if phase in STARTUP_PASSED_PHASES:
            self.passed = True


HEARTBEAT_INTERVAL_S = 1.0
"""Between beats: a fifth of the 5 s a beat may be late before /healthz fails, and one wake-up
a second of the idle supervisor's few (issue 35: 0.1 % of a core in the run phase)."""


class Heartbeat:
    """Measures how late the event loop runs a task that should wake every ``interval_s``.

    ``lag_s()`` is the larger of how late the last beat woke and how overdue the next one is
    now. It can only be read by code running in the same loop, so it sees a loop that is slow or
    was blocked for a while; a loop wedged for good cannot answer at all, and then the prober's
    own timeout is the signal.
    """

    def __init__(
        self, interval_s: float = HEARTBEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval_s <= 0:
            raise ValueError("heartbeat interval must be > 0")
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._late = 0.0

    def beat(self) -> None:
        now = self._clock()
        if self._last is not None:
            self._late = max(0.0, now - self._last - self.interval_s)
        self._last = now

    def lag_s(self) -> float:
        if self._last is None:
            return float("inf")  # never beat: not started, so not alive
        overdue = self._clock() - self._last - self.interval_s
        return max(self._late, overdue, 0.0)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.beat()
