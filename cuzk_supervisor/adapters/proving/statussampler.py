"""The daemon's HTTP status sampled while the bench measures (issues 25 and 33): the evidence of
:mod:`cuzk_supervisor.core.bound`.

Every ``interval_s`` one ``GET /status`` through the one reader (``daemonstatus``; the
daemon's own comment: built for polling every 500 ms), parsed into a
:class:`~cuzk_supervisor.core.boundsample.StatusSample` stamped with the clock the bench stamps
its completions with. Cheap by construction: answers that do not parse are skipped, and a slow
sample only delays the next one. The CPU's busy share is the container's against its quota and
physical cores (``cpumeter.CpuMeter``), or the simulator's ``sim.cpu_busy_share``; each GPU's
utilisation, clocks and slowdown reasons come from ``gpus`` (NVML's ``NvmlProbe.activity``
where ``gpu_probe`` is nvml), or the simulator's ``sim.gpus``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import structlog

from cuzk_supervisor.adapters.proving.daemonstatus import TIMEOUT_S, fetch_status, status_address
from cuzk_supervisor.core.boundsample import GpuActivity, StatusSample, parse_status

log = structlog.get_logger("supervisor.bench")


def sampler_on(status_listen: str, interval_s: float) -> bool:
    """Whether a sampler with these settings samples at all (a listener and an interval)."""
    return interval_s > 0 and status_address(status_listen) is not None


def default_cpu() -> Callable[[], float | None]:
    """The container's CPU meter (imported here: psutil and the cgroup files, once)."""
    from cuzk_supervisor.adapters.machine.cpumeter import CpuMeter, discover_cpu_cgroup

    return CpuMeter(discover_cpu_cgroup())


class StatusSampler:
    """Samples ``/status`` every ``interval_s`` while :meth:`sampling` is entered."""

    def __init__(
        self,
        status_listen: str,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float | None] | None = None,
        gpus: Callable[[], tuple[GpuActivity, ...]] = lambda: (),
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._cpu = cpu
        self._gpus = gpus
        self.address = status_address(status_listen) if interval_s > 0 else None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def _cpu_share(self) -> float | None:
        if self._cpu is None:
            self._cpu = default_cpu()
        return self._cpu()

    async def sample_once(self) -> StatusSample | None:
        if self.address is None:
            return None
        document = await fetch_status(self.address, min(TIMEOUT_S, max(0.05, self.interval_s)))
        return parse_status(document, self._clock(), self._cpu_share(), self._gpus())

    async def _run(self, into: list[StatusSample]) -> None:
        self._cpu_share()  # the meter's first figure only starts its interval
        next_at = self._clock()
        while True:
            sample = await self.sample_once()
            if sample is not None:
                into.append(sample)
            next_at = max(next_at + self.interval_s, self._clock())
            await asyncio.sleep(max(0.0, next_at - self._clock()))

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[list[StatusSample]]:
        """Samples are appended to the yielded list until the block ends (none when off)."""
        samples: list[StatusSample] = []
        if self.address is None:
            yield samples
            return
        task = asyncio.create_task(self._run(samples))
        try:
            yield samples
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            log.debug("bench.status_sampled", samples=len(samples))
