"""GPUs as the simulated daemon reports them on its ``/status`` (``gpu_probe`` sim).

For tests and demos on machines without a GPU: ``parse_sim_status`` reads the ``sim.gpus`` list
of the simulator's status document, ``SimStatusProbe`` fetches it over loopback HTTP. Given the
simulated machine's GPUs (``sim.machine``), the probe reports them idle while no daemon answers
(before the first start, between two), as NVML would: the plan knows the GPUs before any daemon
runs. A real run (``gpu_probe`` nvml or none) never loads this module, nor ``urllib.request``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from cuzk_supervisor.adapters.machine.gpu import FirstSeen, GpuDevice, GpuFault, GpuSample

log = structlog.get_logger("supervisor.gpu")


def parse_sim_status(document: Mapping[str, Any], timestamp: float) -> GpuSample:
    """``sim.gpus[{index, name, vram_total_bytes, vram_used_bytes[, fault]}]`` to a sample.
    A truthy ``fault`` (text, or ``true``) makes that GPU a ``GpuFault``. A document without
    ``sim.gpus`` is an error sample (not the simulator, or an older one)."""
    sim = document.get("sim")
    gpus = sim.get("gpus") if isinstance(sim, Mapping) else None
    if not isinstance(gpus, list):
        return GpuSample(timestamp=timestamp, error="status has no sim.gpus list")
    devices, faults = [], []
    for pos, gpu in enumerate(gpus):
        try:
            index = int(gpu.get("index", pos))
            fault = gpu.get("fault")
            if fault:
                faults.append(GpuFault(index, fault if isinstance(fault, str) else "fault"))
                continue
            total = int(gpu["vram_total_bytes"])
            used = int(gpu["vram_used_bytes"])
            free = int(gpu.get("vram_free_bytes", total - used))
            uuid = None if gpu.get("uuid") is None else str(gpu["uuid"])
            devices.append(
                GpuDevice(index, str(gpu.get("name", "")), uuid, total, used, max(0, free))
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            faults.append(GpuFault(pos, f"malformed sim gpu entry: {exc!r}"))
    return GpuSample(timestamp=timestamp, devices=tuple(devices), faults=tuple(faults))


def _nobody_listens(exc: BaseException) -> bool:
    """Refused or dropped at once: no daemon (yet, or any more) behind the status address."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, ConnectionRefusedError | ConnectionResetError | FileNotFoundError)


class SimStatusProbe:
    """GPUs as the simulated daemon reports them on ``[daemon] status_listen`` (loopback HTTP).

    A bare ``http://host:port`` ``url`` gets ``/status`` appended. Plain ``urllib``, a short
    timeout, no retries (the next sample is the retry); always available. Where nothing listens
    the sample is ``idle_devices`` when given (the simulated machine's GPUs), else an ``error``;
    any other failure (a timeout, a bad answer) is an ``error``.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        idle_devices: Sequence[GpuDevice] = (),
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.path in ("", "/"):
            url = urllib.parse.urlunsplit(parts._replace(path="/status"))
        self.url = url
        self._timeout = timeout_s
        self._clock = clock
        self._new_error = FirstSeen()
        self.idle_devices = tuple(idle_devices)

    available = True
    reason = ""

    def devices(self) -> list[GpuDevice]:
        return list(self.sample().devices)

    def sample(self) -> GpuSample:
        now = self._clock()
        try:
            with urllib.request.urlopen(self.url, timeout=self._timeout) as resp:
                document = json.loads(resp.read())
        except (OSError, ValueError) as exc:  # URLError, timeouts and bad JSON included
            if self.idle_devices and _nobody_listens(exc):
                return GpuSample(timestamp=now, devices=self.idle_devices)
            text = f"{type(exc).__name__}: {exc}"
            if self._new_error(None, text):
                log.warning("gpu.sim_status_failed", gpu=None, error=text, url=self.url)
            return GpuSample(timestamp=now, error=text)
        if not isinstance(document, Mapping):
            return GpuSample(timestamp=now, error="status is not a JSON object")
        sample = parse_sim_status(document, now)
        for fault in sample.faults:
            if self._new_error(fault.index, fault.error):
                log.warning("gpu.read_failed", gpu=fault.index, error=fault.error)
        return sample

    def shutdown(self) -> None:
        pass
