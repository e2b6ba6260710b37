"""The peak RSS of the daemon's process tree while it runs (``peak_rss_bytes`` on
``daemon.exited``): read often at first (a daemon that dies at start-up grew fast), then every
``interval_s``, unless readings taken elsewhere come (the memory watch's, ``note``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from cuzk_supervisor.daemon.spec import RssSampler

RSS_INTERVAL_S = 1.0  # between readings of our own (a /proc listing: well under a millisecond)
NOTED_RECHECK_INTERVALS = 5
"""A reading noted from elsewhere spares our own for this many intervals (the memory watch's come
every interval, a little late at times): at most that long without a reading after they stop."""
FIRST_PAUSE_S = 0.05


class PeakRss:
    """The highest RSS of one daemon's tree seen: by its own readings (``watch``), by readings
    handed over (``note``) and by one read on demand (``read``: its size as it is stopped)."""

    def __init__(
        self,
        sampler: RssSampler,
        interval_s: float = RSS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._sampler = sampler
        self._sleep = sleep
        self._interval_s = interval_s
        self._clock = clock
        self._noted_at = -float("inf")  # when a reading taken elsewhere last came
        self.bytes = 0

    def keep(self, rss_bytes: int | None) -> None:
        if rss_bytes is not None and rss_bytes > self.bytes:
            self.bytes = rss_bytes

    def note(self, rss_bytes: int | None) -> None:
        """A reading taken elsewhere (the memory watch's): it counts toward the peak and spares
        our own readings (one walk of ``/proc`` a second, not two)."""
        if rss_bytes is not None:
            self._noted_at = self._clock()
            self.keep(rss_bytes)

    def read(self, pid: int) -> None:
        self.keep(self._sampler(pid))

    async def watch(self, pid: int) -> None:
        """Keep the peak until the tree is gone: our own readings every ``interval_s`` (sooner at
        first) while none come from elsewhere; while they come, a look only once the last would
        be ``NOTED_RECHECK_INTERVALS`` intervals old (not a wake-up a second)."""
        interval = self._interval_s
        spared_s = NOTED_RECHECK_INTERVALS * interval
        pause = min(FIRST_PAUSE_S, interval)
        while True:
            since = self._clock() - self._noted_at
            if since < spared_s:  # readings come from elsewhere: look again once they would
                await self._sleep(spared_s - since)  # be that old
                continue
            rss = self._sampler(pid)
            if rss is None:
                return
            self.keep(rss)
            await self._sleep(pause)
            pause = min(pause * 2, interval)
