"""A fake ``pynvml`` for the simulated machine: NVML as it would answer about the simulated GPUs
(issue 34). The supervisor's own NVML code (:mod:`~cuzk_supervisor.adapters.machine.nvmlevents`,
:class:`~cuzk_supervisor.adapters.machine.gpunvml.NvmlProbe`) runs against it unchanged.

What it knows comes from two places: the GPUs' hardware condition (:mod:`.gpustate`: lost,
throttled, ECC counters, XID events, the file the simulated daemon writes) and whether each GPU
is working now (``busy``: the GPUs whose workers the daemon's status shows proving; None when
the daemon does not answer, i.e. idle). A lost GPU raises ``NVMLError_GpuIsLost`` from every
call about it; an idle GPU clocks down with the idle reason, as a real one does; a busy one runs
at its maximum, or at its ``clock_ratio`` with its slowdown reasons when throttled. The event set
delivers each XID once, the ones raised after it was registered; its wait never blocks.

The error classes and constants are pynvml's own, so that code written against the real module
sees the same types and numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from cuzk_supervisor.sim.machine.gpustate import FILE, IDLE_BIT, SLOWDOWN_BITS, GpuState

MAX_SM_CLOCK_MHZ = 1695
IDLE_CLOCK_RATIO = 0.2
XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
DBE_EVENT = pynvml.nvmlEventTypeDoubleBitEccError


@dataclass(frozen=True, slots=True)
class Handle:
    index: int


@dataclass(slots=True)
class EventSet:
    registered: dict[int, int] = field(default_factory=dict)
    """GPU -> the last XID sequence number delivered (or seen at registration)."""


class FakeNvml:
    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = XID_EVENT
    nvmlEventTypeDoubleBitEccError = DBE_EVENT
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )

    def __init__(
        self,
        gpus: int,
        state: Callable[[], GpuState],
        *,
        busy: Callable[[], frozenset[int] | None] = lambda: None,
        vram_bytes: int = 24 << 30,
        name: str = "NVIDIA GeForce RTX 3090 (cuzk-sim)",
        ecc: bool = True,
        remaps_rows: bool = False,
    ) -> None:
        self.gpus = gpus
        self._state = state
        self._busy = busy
        self.vram_bytes = vram_bytes
        self.name = name
        self.ecc = ecc
        """False: a GPU without ECC (a consumer card): its counters are not supported."""
        self.remaps_rows = remaps_rows
        """True: an A100 or later, which remaps rows instead of retiring pages."""
        self.inits = 0

    # --- the library ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits = max(0, self.inits - 1)

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def _live(self, handle: Handle | int) -> int:
        index = handle.index if isinstance(handle, Handle) else int(handle)
        if not 0 <= index < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._state().condition(index).lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(self._live(index))

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._live(handle)
        return self.name

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return f"GPU-cuzk-sim-{self._live(handle):04d}"

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        index = self._live(handle)
        used = (12 << 30) if index in (self._busy() or ()) else 0
        return SimpleNamespace(total=self.vram_bytes, used=used, free=self.vram_bytes - used)

    # --- events -----------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._live(handle)
        return XID_EVENT | (DBE_EVENT if self.ecc else 0)

    def nvmlEventSetCreate(self) -> EventSet:
        return EventSet()

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, events: EventSet) -> None:
        index = self._live(handle)
        if types & XID_EVENT:
            xids = self._state().xids
            events.registered[index] = xids[-1][0] if xids else 0

    def nvmlEventSetWait_v2(self, events: EventSet, timeout_ms: int) -> Any:
        """The next XID for a registered GPU; ``NVMLError_Timeout`` at once when none waits."""
        for number, gpu, code in self._state().xids:
            if gpu in events.registered and number > events.registered[gpu]:
                events.registered[gpu] = number
                return SimpleNamespace(device=Handle(gpu), eventType=XID_EVENT, eventData=code,
                                       gpuInstanceId=0, computeInstanceId=0)  # fmt: skip
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, events: EventSet) -> None:
        events.registered.clear()

    # --- ECC ---------------------------------------------------------------------------------

    def _ecc(self, handle: Handle) -> int:
        index = self._live(handle)
        if not self.ecc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, kind: int, counter: int) -> int:
        condition = self._state().condition(self._ecc(handle))
        return condition.ecc_uncorrected if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    def _pages(self, handle: Handle, *, rows: bool) -> int:
        index = self._ecc(handle)
        if rows != self.remaps_rows:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> list[int]:
        condition = self._state().condition(self._pages(handle, rows=False))
        return [0x1000 * (i + 1) for i in range(condition.retired_pages)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._state().condition(self._pages(handle, rows=False)).retirement_pending)

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        """(corrected, uncorrected, pending, failure): the pages count as uncorrected rows."""
        condition = self._state().condition(self._pages(handle, rows=True))
        return (0, condition.retired_pages, int(condition.retirement_pending), 0)

    # --- clocks ------------------------------------------------------------------------------

    def _working(self, handle: Handle) -> tuple[int, bool]:
        index = self._live(handle)
        return index, index in (self._busy() or ())

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        _, busy = self._working(handle)
        return SimpleNamespace(gpu=100 if busy else 0, memory=40 if busy else 0)

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, kind: int) -> int:
        self._live(handle)
        return MAX_SM_CLOCK_MHZ

    def nvmlDeviceGetClockInfo(self, handle: Handle, kind: int) -> int:
        index, busy = self._working(handle)
        ratio = self._state().condition(index).clock_ratio if busy else IDLE_CLOCK_RATIO
        return round(MAX_SM_CLOCK_MHZ * ratio)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        index, busy = self._working(handle)
        if not busy:
            return IDLE_BIT
        condition = self._state().condition(index)
        return sum(SLOWDOWN_BITS.get(name, 0) for name in set(condition.slowdowns))


class GpuStateFile:
    """The condition file read again whenever it changed (a cheap ``stat`` otherwise)."""

    def __init__(self, folder: Path, gpus: int) -> None:
        self.folder = folder
        self.gpus = gpus
        self._seen: tuple[int, int, int] | None = None
        self._state = GpuState(gpus=gpus)

    def __call__(self) -> GpuState:
        try:
            stat = (self.folder / FILE).stat()
        except OSError:
            return self._state
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # each write is a new file
        if key != self._seen:
            self._seen = key
            self._state = GpuState.load(self.folder, self.gpus)
        return self._state
