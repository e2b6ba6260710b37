"""The GPUs' health through NVML, for the run phase's health watch (issue 34).

One :class:`NvmlHealth` reads, at each observation and for each device, a
:class:`~cuzk_supervisor.core.healthevidence.GpuView`:

- the **XID events** since the previous read, from an NVML event set per device (critical XIDs,
  and double-bit ECC errors where supported, read as XID 48), drained with a zero timeout;
- the **ECC** counters: uncorrected errors since the driver loaded, pages retired for double-bit
  errors and whether a retirement waits for a reset (None where the GPU has no ECC);
- the **clocks**: utilisation, SM clock against its maximum, the slowdown reasons (``gpunvml``);
- whether the device **answers** at all: one NVML cannot read (``GPU is lost`` after it fell
  off the bus, any error on its handle or memory) is ``answering`` False with the error's text;
  its handle is looked up again at the next read.

``nvml`` is the module (default ``import pynvml``); tests and the simulator pass a fake
(``sim.machine.fakenvml``). No library or no driver: ``available`` is False with the reason,
never an exception. NVML calls can block on a GPU in a bad state: :meth:`read` in a thread.
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog

from cuzk_supervisor.adapters.machine.gpunvml import nvml_activity
from cuzk_supervisor.adapters.machine.gpunvml import nvml_error_text as _error_text
from cuzk_supervisor.core.healthevidence import GpuView

log = structlog.get_logger("supervisor.health")

# NVML's values (nvml.h), for bindings that lack a name.
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DOUBLE_BIT_ECC = 0x2  # nvmlEventTypeDoubleBitEccError
XID_DOUBLE_BIT_ECC = 48
MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC = 0  # NVML_VOLATILE_ECC
RETIRED_DOUBLE_BIT = 1  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
ERROR_NOT_SUPPORTED = 3
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
MAX_EVENTS_PER_READ = 64
"""Events drained from one device's set at one read (a storm waits for the next read)."""


class NvmlHealth:
    def __init__(self, nvml: Any = None) -> None:
        self._nvml: Any = None
        self.reason = ""
        self._handles: list[Any] = []
        self._sets: list[Any] = []
        try:
            if nvml is None:
                import pynvml  # here, so a broken install only disables the reads

                nvml = pynvml
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # no library, no driver, no devices listed
            self.reason = _error_text(exc)
            log.warning("health.nvml_unavailable", reason=self.reason)
            return
        self._nvml = nvml
        self._handles = [None] * count
        self._sets = [None] * count
        self._code = {name: getattr(nvml, name, default) for name, default in (
            ("NVML_ERROR_TIMEOUT", ERROR_TIMEOUT),
            ("NVML_ERROR_NOT_SUPPORTED", ERROR_NOT_SUPPORTED),
            ("NVML_ERROR_GPU_IS_LOST", ERROR_GPU_IS_LOST),
            ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", MEMORY_ERROR_UNCORRECTED),
            ("NVML_VOLATILE_ECC", VOLATILE_ECC),
            ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", RETIRED_DOUBLE_BIT),
        )}  # fmt: skip
        for index in range(count):
            self._register(index)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def _handle(self, index: int) -> Any:
        handle = self._handles[index]
        if handle is None:
            handle = self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return handle

    def _register(self, index: int) -> None:
        """An event set for this device's critical XIDs (and double-bit ECC where supported);
        a device or driver that refuses is read without events (one warning)."""
        nvml = self._nvml
        wanted = getattr(nvml, "nvmlEventTypeXidCriticalError", EVENT_XID)
        dbe = getattr(nvml, "nvmlEventTypeDoubleBitEccError", EVENT_DOUBLE_BIT_ECC)
        try:
            handle = self._handle(index)
            try:
                if int(nvml.nvmlDeviceGetSupportedEventTypes(handle)) & dbe:
                    wanted |= dbe
            except nvml.NVMLError:
                pass  # XIDs alone
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, wanted, events)
        except nvml.NVMLError as exc:
            log.warning("health.nvml_events_off", gpu=index, reason=_error_text(exc))
            return
        self._sets[index] = events

    def read(self) -> tuple[GpuView, ...]:
        """Every device's view now (blocking: NVML may stall on a GPU in a bad state)."""
        if self._nvml is None:
            return ()
        return tuple(self._read(index) for index in range(len(self._handles)))

    def _read(self, index: int) -> GpuView:
        nvml = self._nvml
        xids = self._drain(index)
        try:
            handle = self._handle(index)
            nvml.nvmlDeviceGetMemoryInfo(handle)  # a device that cannot say this is not there
        except nvml.NVMLError as exc:
            self._handles[index] = None  # a GPU back after a reset has a new handle
            return GpuView(index, answering=False, error=_error_text(exc), xids=xids)
        try:
            code = self._code
            unc = self._optional(lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, code["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"], code["NVML_VOLATILE_ECC"],
            ))  # fmt: skip
            pages = self._optional(lambda: nvml.nvmlDeviceGetRetiredPages(
                handle, code["NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"]))  # fmt: skip
            pending = self._optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            # A100 and later remap rows instead: (corrected, uncorrected, pending, failed).
            rows = self._optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        except _Lost as lost:
            self._handles[index] = None
            return GpuView(index, answering=False, error=str(lost), xids=xids)
        activity = nvml_activity(nvml, index, handle)
        if rows is not None:
            pages = [*(pages or ()), *range(int(rows[1]))]
            pending = bool(pending) or bool(rows[2])
        return GpuView(
            index,
            xids=xids,
            ecc_uncorrected=int(unc) if unc is not None else None,
            retired_pages=len(pages) if pages is not None else None,
            retirement_pending=bool(pending) if pending is not None else None,
            remap_failed=rows is not None and bool(rows[3]),
            utilisation=activity.utilisation,
            sm_clock_ratio=activity.sm_clock_ratio,
            slowdowns=activity.slowdowns,
        )

    def _optional(self, call: Any) -> Any:
        """A figure this device may not report (None); a lost device is not a missing figure."""
        nvml = self._nvml
        try:
            return call()
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._code["NVML_ERROR_GPU_IS_LOST"]:
                raise _Lost(_error_text(exc)) from None
            return None

    def _drain(self, index: int) -> tuple[int, ...]:
        """The XIDs waiting in this device's event set (none waited for)."""
        events = self._sets[index]
        if events is None:
            return ()
        nvml = self._nvml
        dbe = getattr(nvml, "nvmlEventTypeDoubleBitEccError", EVENT_DOUBLE_BIT_ECC)
        found: list[int] = []
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != self._code["NVML_ERROR_TIMEOUT"]:
                    log.debug("health.nvml_event_wait_failed", gpu=index, reason=_error_text(exc))
                break
            kind = int(getattr(data, "eventType", 0))
            found.append(XID_DOUBLE_BIT_ECC if kind & dbe else int(getattr(data, "eventData", 0)))
        return tuple(found)

    def shutdown(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        for events in self._sets:
            if events is not None:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlEventSetFree(events)
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.warning("health.nvml_shutdown_failed", reason=_error_text(exc))


class _Lost(Exception):
    """A device NVML says is lost; the message is NVML's error text."""
