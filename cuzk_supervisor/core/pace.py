"""The pace of a backlog drain (pure): a token bucket in lines per second.

After an outage every machine of the fleet holds a backlog of log lines. Sent back to back they
hit the manager all at once (a model of 2,000 machines after 30 minutes peaked at 3,000+
requests/s); the manager keeps only the last 10,000 lines of an instance anyway. So the log
shipper drains at a bounded pace: at most ``rate_per_s`` lines a second on average, at most
``burst`` at once (one full body), whatever the backlog. Times are arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Pace"]


@dataclass(slots=True)
class Pace:
    """A token bucket: ``rate_per_s`` tokens a second, at most ``burst`` held, full at start."""

    rate_per_s: float
    burst: float
    tokens: float = field(default=math.nan)
    last: float | None = None

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and self.burst >= 1):
            raise ValueError(
                f"Pace needs rate_per_s > 0 and burst >= 1, got {self.rate_per_s!r}, {self.burst!r}"
            )
        if math.isnan(self.tokens):
            self.tokens = float(self.burst)

    def _refill(self, now: float) -> None:
        if self.last is not None and now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate_per_s)
        if self.last is None or now > self.last:
            self.last = now

    def available(self, now: float) -> int:
        """Whole tokens (lines) that may go now."""
        self._refill(now)
        return int(self.tokens)

    def wait_s(self, now: float, want: float) -> float:
        """Seconds until ``want`` tokens (at most ``burst``) are held; 0 when they are now."""
        self._refill(now)
        want = min(want, self.burst)
        return max(0.0, (want - self.tokens) / self.rate_per_s)

    def spend(self, now: float, count: float) -> None:
        """``count`` lines went out at ``now`` (the bucket may go below 0: a long line)."""
        self._refill(now)
        self.tokens -= count
