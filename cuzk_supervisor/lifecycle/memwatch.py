"""Watch memory while proving: sample, assess the OOM risk, tell the lifecycle when it is critical.

The sampler reads a handful of small files (well under a millisecond), so it runs in the event
loop. The decision is ``core.risk.assess_risk``; this module only keeps the recent samples, logs
each change of level with the numbers behind it, and raises an event the lifecycle waits on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog

from cuzk_supervisor.adapters.machine.resources import MemorySampler, MemorySnapshot
from cuzk_supervisor.core.risk import (
    MemorySample,
    RiskAssessment,
    RiskLevel,
    RiskPolicy,
    assess_risk,
    sample_interval_s,
)

log = structlog.get_logger()

_KEPT_SAMPLES = 200  # at most, for the trend (its window at the fast interval is 100)


@dataclass(eq=False)
class MemoryWatch:
    """One task (``run``) sampling memory; ``critical`` is set when the risk becomes critical."""

    sampler: MemorySampler
    policy: RiskPolicy
    daemon_pid: Callable[[], int | None]
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    level: RiskLevel = field(default=RiskLevel.OK, init=False)
    last: MemorySnapshot | None = field(default=None, init=False)
    assessment: RiskAssessment | None = field(default=None, init=False)
    critical: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    base_bytes: int | None = field(default=None, init=False)
    """Usage with the daemon idle (ready, no proof yet): the base a fit is measured over."""
    plateau_bytes: int | None = field(default=None, init=False)
    """Where the running plan's usage is measured to level off (a fitted step-down)."""
    _samples: deque[MemorySample] = field(
        default_factory=lambda: deque(maxlen=_KEPT_SAMPLES), init=False
    )
    _listeners: list[Callable[[RiskAssessment], None]] = field(default_factory=list, init=False)

    def add_listener(self, listener: Callable[[RiskAssessment], None]) -> None:
        """Called with every assessment (metrics, status lines)."""
        self._listeners.append(listener)

    def at_limit(self) -> bool:
        """For exit classification: was memory critical in the last samples?"""
        return self.level is RiskLevel.CRITICAL

    def mark_base(self) -> None:
        """The daemon is ready and idle: its usage now is the base of the next measurement."""
        self.base_bytes = self.sample_once().used_bytes

    def acknowledge(self) -> None:
        """The lifecycle acted on the critical level: forget the old samples and start over."""
        self.critical.clear()
        self._samples.clear()
        self.level = RiskLevel.OK

    def sample_once(self) -> RiskAssessment:
        snapshot = self.sampler.sample(self.daemon_pid())
        self.last = snapshot
        limit = snapshot.effective_limit
        used = max(0, limit - snapshot.headroom)
        now = self.clock()
        samples = self._samples
        samples.append(MemorySample(now, used, snapshot.psi_some_avg10))
        # Only the trend window and the last two samples count (``assess_risk``): the older ones
        # are dropped, not walked again at every sample (issue 35: the idle supervisor's CPU).
        while len(samples) > 2 and samples[0].t < now - self.policy.trend_window_s:
            samples.popleft()
        assessment = assess_risk(
            list(self._samples), limit, self.level, self.policy, self.plateau_bytes
        )
        self.assessment = assessment
        if assessment.changed:
            fields = {
                "daemon_rss": snapshot.daemon_rss,
                "cgroup_limit": snapshot.cgroup_limit,
                **assessment.to_dict(),
            }
            if assessment.level is RiskLevel.CRITICAL:
                log.warning("memory.risk_critical", **fields)
            else:
                log.warning("memory.risk_changed", **fields)
        self.level = assessment.level
        if assessment.level is RiskLevel.CRITICAL:
            self.critical.set()
        for listener in self._listeners:
            listener(assessment)
        return assessment

    async def run(self) -> None:
        """Sample until cancelled, faster when memory is tight."""
        while True:
            assessment = self.sample_once()
            await asyncio.sleep(sample_interval_s(assessment, self.policy))
