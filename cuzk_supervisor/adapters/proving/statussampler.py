"""The daemon's HTTP status sampled while the bench measures (issue 25): the evidence of
:mod:`cuzk_supervisor.core.bound`.

Every ``interval_s`` one ``GET /status`` on ``[daemon] status_listen`` (cuzk.md, "Optional HTTP
status listener"; the daemon's own comment: built for polling every 500 ms), parsed into a
:class:`~cuzk_supervisor.core.bound.StatusSample` stamped with the monotonic clock the bench
stamps its completions with. Cheap by construction: one short HTTP/1.0 request on the event loop
(no thread, no retries: the next tick is the retry), answers that do not parse are skipped, and
a sample that takes longer than the interval only delays the next one. The CPU's busy share
comes from the simulated daemon's ``sim.cpu_busy_share`` when it is the simulator (its machine
is simulated), else from psutil (the whole machine, since the previous sample). Each GPU's
utilisation, clocks and slowdown reasons come from ``gpus`` (NVML's
:meth:`~cuzk_supervisor.adapters.machine.gpu.NvmlProbe.activity` where ``gpu_probe`` is nvml).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psutil
import structlog

from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.core.bound import (
    GpuActivity,
    GpuWorkerSample,
    PartitionSample,
    PipelineSample,
    StatusSample,
)
from cuzk_supervisor.deadline import within
from cuzk_supervisor.errors import UsageError

log = structlog.get_logger("supervisor.bench")

MAX_BODY_BYTES = 4 << 20
TIMEOUT_S = 1.0


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _share(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value)))


def parse_status(
    document: object,
    at: float,
    cpu_busy_share: float | None = None,
    gpus: tuple[GpuActivity, ...] = (),
) -> StatusSample | None:
    """A sample from one ``/status`` document; None when it has no ``synthesis`` object. Items
    that are not what the daemon writes are left out, never fatal."""
    if not isinstance(document, dict):
        return None
    synthesis = document.get("synthesis")
    if not isinstance(synthesis, dict):
        return None
    pipelines = []
    for item in document.get("pipelines") or ():
        if not isinstance(item, dict):
            continue
        parts = tuple(
            PartitionSample(
                _int(p.get("index")), str(p.get("state", "")), _ms(p.get("synth_ms")),
                _ms(p.get("gpu_ms")),
            )
            for p in item.get("partitions") or ()
            if isinstance(p, dict)
        )  # fmt: skip
        job = str(item.get("job_id", ""))
        pipelines.append(PipelineSample(job, parts, _int(item.get("total_partitions"))))
    workers = tuple(
        GpuWorkerSample(
            _int(w.get("worker_id"), i), _int(w.get("gpu_ordinal")), w.get("state") == "proving"
        )
        for i, w in enumerate(document.get("gpu_workers") or ())
        if isinstance(w, dict)
    )
    sim = document.get("sim")
    if isinstance(sim, dict):  # the simulator: its machine's CPU, not ours
        cpu_busy_share = _share(sim.get("cpu_busy_share"))
    return StatusSample(
        at=at,
        synth_max=max(0, _int(synthesis.get("max_concurrent"))),
        synth_active=max(0, _int(synthesis.get("active"))),
        pipelines=tuple(pipelines),
        gpu_workers=workers,
        cpu_busy_share=cpu_busy_share,
        gpus=gpus,
    )


async def fetch_status(address: Address, timeout_s: float = TIMEOUT_S) -> object | None:
    """The ``/status`` JSON, or None (no answer in time, not 200, not JSON)."""

    async def get() -> bytes:
        if address.path is not None:
            reader, writer = await asyncio.open_unix_connection(str(address.path))
        else:
            reader, writer = await asyncio.open_connection(address.host, address.port)
        try:
            writer.write(b"GET /status HTTP/1.0\r\nHost: cuzk\r\nConnection: close\r\n\r\n")
            await writer.drain()
            raw = b""
            # HTTP/1.0 with Connection: close: the answer ends at EOF (one read() is one chunk)
            while chunk := await reader.read(65536):
                raw += chunk
                if len(raw) > MAX_BODY_BYTES:
                    return b""
            return raw
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    try:
        raw = await within(get(), timeout_s)
    except (OSError, TimeoutError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        return None
    try:
        document: object = json.loads(body)
    except ValueError:
        return None
    return document


def cpu_busy_share() -> float | None:
    """The machine's CPU busy share since the previous call (psutil; None if it cannot tell)."""
    try:
        return psutil.cpu_percent(interval=None) / 100.0
    except (OSError, psutil.Error):
        return None


def sampler_on(status_listen: str, interval_s: float) -> bool:
    """Whether a sampler with these settings samples at all (a listener and an interval)."""
    return StatusSampler(status_listen, interval_s).enabled


class StatusSampler:
    """Samples ``/status`` every ``interval_s`` while :meth:`sampling` is entered."""

    def __init__(
        self,
        status_listen: str,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float | None] = cpu_busy_share,
        gpus: Callable[[], tuple[GpuActivity, ...]] = lambda: (),
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._cpu = cpu
        self._gpus = gpus
        self.address: Address | None = None
        if interval_s > 0 and status_listen:
            try:
                self.address = parse_address(status_listen)
            except UsageError:
                self.address = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    async def sample_once(self) -> StatusSample | None:
        if self.address is None:
            return None
        document = await fetch_status(self.address, min(TIMEOUT_S, max(0.05, self.interval_s)))
        return parse_status(document, self._clock(), self._cpu(), self._gpus())

    async def _run(self, into: list[StatusSample]) -> None:
        self._cpu()  # psutil's first figure only starts its interval
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
