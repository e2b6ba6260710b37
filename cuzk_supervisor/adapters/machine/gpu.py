"""The GPUs as the supervisor sees them: plain values, the probe's interface, fixed devices.

Three probes stand behind one small interface (docs/architecture.md, rule 7: no GPU needed to
test), each in a module of its own so that a run loads only the one its ``gpu_probe`` names
(``compose.host_gpu_probe``): ``gpunvml.NvmlProbe`` (the real thing, through NVML),
``gpusimstatus.SimStatusProbe`` (the simulated daemon's ``GET /status``, for tests and demos
without a GPU) and ``StaticProbe`` (here: fixed devices, for tests and ``plan --gpus N
--vram-gib G`` what-ifs).

A sample is plain data: the devices that answered, and a ``GpuFault`` for each one that did not.
NVML calls can block (a GPU in a bad state can stall them), and ``SimStatusProbe`` does HTTP:
call ``sample()`` through ``asyncio.to_thread`` from the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cuzk_supervisor.core.bound import GpuActivity

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str
    uuid: str | None
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class GpuFault:
    """A device that did not answer this sample (NVML error, or a fault flagged by the sim)."""

    index: int
    error: str


@dataclass(frozen=True, slots=True)
class GpuSample:
    """``error`` is set when the probe as a whole could not be read (e.g. the sim's status
    endpoint did not answer); then there are no devices and no faults."""

    timestamp: float
    devices: tuple[GpuDevice, ...] = ()
    faults: tuple[GpuFault, ...] = ()
    error: str | None = None


@runtime_checkable
class GpuProbe(Protocol):
    @property
    def available(self) -> bool: ...

    @property
    def reason(self) -> str:
        """Why the probe is unavailable ("" when it is available)."""
        ...

    def devices(self) -> list[GpuDevice]:
        """The devices that answer now (a fresh sample, faults left out)."""
        ...

    def sample(self) -> GpuSample: ...

    def shutdown(self) -> None: ...


class FirstSeen:
    """Whether an error is new for its device: each distinct error is logged once per device (a
    broken GPU must not flood the log)."""

    def __init__(self) -> None:
        self._seen: set[tuple[int | None, str]] = set()

    def __call__(self, index: int | None, error: str) -> bool:
        if (index, error) in self._seen:
            return False
        self._seen.add((index, error))
        return True


def no_gpu_activity() -> tuple[GpuActivity, ...]:
    """The activity source where NVML is not the probe."""
    return ()


@dataclass
class StaticProbe:
    """Fixed devices (and optional faults): tests and what-if planning."""

    fixed_devices: Sequence[GpuDevice] = ()
    fixed_faults: Sequence[GpuFault] = ()
    clock: Callable[[], float] = field(default=time.time)

    available = True
    reason = ""

    @classmethod
    def uniform(cls, count: int, vram_gib: float, name: str = "what-if GPU") -> StaticProbe:
        """``count`` idle GPUs of ``vram_gib`` GiB each (``plan --gpus N --vram-gib G``)."""
        total = int(vram_gib * GIB)
        return cls([GpuDevice(i, name, None, total, 0, total) for i in range(count)])

    def devices(self) -> list[GpuDevice]:
        return list(self.fixed_devices)

    def sample(self) -> GpuSample:
        return GpuSample(self.clock(), tuple(self.fixed_devices), tuple(self.fixed_faults))

    def shutdown(self) -> None:
        pass


def total_vram(devices: Iterable[GpuDevice]) -> int:
    return sum(d.total_bytes for d in devices)
