"""GPUs through NVML: the probe of a real machine (``gpu_probe`` nvml), and one GPU's activity.

``NvmlProbe`` reads the devices' memory for the plan and the memory watch; ``nvml_activity``
one GPU's utilisation, SM clock and slowdown reasons (the bench's evidence, and the run phase's
health reads in ``nvmlevents``). ``nvml`` is the module (default: ``import pynvml``, done when
the probe is made, so a broken install only disables the probe); tests pass a fake with the
same names. No library or no driver makes the probe unavailable with one warning, never an
exception. NVML calls can block on a GPU in a bad state: call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from cuzk_supervisor.adapters.machine.gpu import FirstSeen, GpuDevice, GpuFault, GpuSample
from cuzk_supervisor.core.bound import GpuActivity

log = structlog.get_logger("supervisor.gpu")


def _text(value: str | bytes) -> str:
    # Old bindings return bytes; nvidia-ml-py >= 11.515 returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def nvml_error_text(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ can itself call into the library
        text = ""
    return f"{name}: {text}" if text and text != name else name


NVML_CLOCK_SM = 1
SLOWDOWN_BITS = (
    (0x4, "power-cap"),
    (0x8, "hw-slowdown"),
    (0x20, "thermal"),
    (0x40, "hw-thermal"),
    (0x80, "power-brake"),
)
"""NVML's clocks event (throttle) reasons that hold the clocks below what the load asks for
(idle, application clocks, sync boost and display settings are left out)."""


def nvml_activity(nvml: Any, index: int, handle: Any) -> GpuActivity:
    """One GPU's utilisation, SM clock against its maximum and the reasons its clocks are held
    down, through ``nvml``; a figure this GPU or driver does not report is None."""

    def read(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except nvml.NVMLError:
            return None

    rates = read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    clock = read(lambda: nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM))
    top = read(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM))
    # Renamed "clocks event reasons" in newer bindings; the bits are the same.
    reasons_of = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = read(lambda: reasons_of(handle)) if reasons_of is not None else None
    return GpuActivity(
        index=index,
        utilisation=min(1.0, int(rates.gpu) / 100) if rates is not None else None,
        sm_clock_ratio=min(1.0, int(clock) / int(top)) if clock and top else None,
        slowdowns=tuple(n for bit, n in SLOWDOWN_BITS if mask and int(mask) & bit),
    )


class NvmlProbe:
    """GPUs through NVML. ``nvml`` is the module (default: ``import pynvml``); tests pass a
    fake with the same names. NVML is initialised once, here."""

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._new_error = FirstSeen()
        self._nvml: Any = None
        self._reason = ""
        self._handles: list[Any] = []
        self._names: dict[int, str] = {}
        self._uuids: dict[int, str | None] = {}
        self._memory_v2: bool = True
        try:
            if nvml is None:
                import pynvml  # here, so a broken install only disables the probe

                nvml = pynvml
            nvml.nvmlInit()
        except Exception as exc:  # any failure at init (no library, no driver) disables the probe
            self._reason = (
                nvml_error_text(exc) if nvml is not None else f"{type(exc).__name__}: {exc}"
            )
            log.warning("gpu.watch_disabled", reason="NVML unavailable", error=self._reason)
            return
        self._nvml = nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._reason = nvml_error_text(exc)
            log.warning("gpu.watch_disabled", reason="NVML device count failed", error=self._reason)
            self.shutdown()
            return
        self._handles = [None] * count
        # v2 reports "reserved" apart from "used" (drivers >= 510); old bindings lack the name.
        self._memory_v2 = hasattr(nvml, "nvmlMemory_v2")

    @property
    def available(self) -> bool:
        return self._nvml is not None

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def devices(self) -> list[GpuDevice]:
        return list(self.sample().devices)

    def sample(self) -> GpuSample:
        now = self._clock()
        if self._nvml is None:
            return GpuSample(timestamp=now)
        devices: list[GpuDevice] = []
        faults: list[GpuFault] = []
        for index in range(len(self._handles)):
            try:
                devices.append(self._read(index))
            except self._nvml.NVMLError as exc:
                text = nvml_error_text(exc)
                # A lost GPU can come back with a new handle (after a reset): look it up again.
                self._handles[index] = None
                if self._new_error(index, text):
                    log.warning("gpu.read_failed", gpu=index, error=text)
                faults.append(GpuFault(index, text))
        return GpuSample(timestamp=now, devices=tuple(devices), faults=tuple(faults))

    def _read(self, index: int) -> GpuDevice:
        nvml = self._nvml
        handle = self._handles[index]
        if handle is None:
            handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        if index not in self._names:
            self._names[index] = _text(nvml.nvmlDeviceGetName(handle))
            try:
                self._uuids[index] = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                self._uuids[index] = None  # optional: not worth a fault
        mem = self._memory(handle)
        return GpuDevice(
            index=index,
            name=self._names[index],
            uuid=self._uuids.get(index),
            total_bytes=int(mem.total),
            used_bytes=int(mem.used),
            free_bytes=int(mem.free),
        )

    def activity(self) -> tuple[GpuActivity, ...]:
        """Each answering GPU's utilisation, SM clock against its maximum and the reasons its
        clocks are held down (the bench's evidence, issue 25). A figure this GPU or driver does
        not report is None; a GPU that does not answer is left out (``sample`` reports it)."""
        if self._nvml is None:
            return ()
        found = []
        for index in range(len(self._handles)):
            try:
                handle = self._handles[index]
                if handle is None:
                    handle = self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
            except self._nvml.NVMLError:
                continue
            found.append(nvml_activity(self._nvml, index, handle))
        return tuple(found)

    def _memory(self, handle: Any) -> Any:
        nvml = self._nvml
        if self._memory_v2:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            except nvml.NVMLError as exc:
                # The driver lacks the v2 entry point or struct version: use v1 from now on.
                unsupported = {
                    getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                    getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
                    getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                }
                if getattr(exc, "value", None) not in unsupported:
                    raise
                self._memory_v2 = False
                log.info("gpu.nvml_memory_v1", reason="memory info v2 unsupported", error=str(exc))
        return nvml.nvmlDeviceGetMemoryInfo(handle)

    def shutdown(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        self._reason = self._reason or "shut down"
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.warning("gpu.nvml_shutdown_failed", error=nvml_error_text(exc))
