"""GPU probes behind one small interface (DESIGN principle 9: no GPU needed to test).

- ``NvmlProbe``: the real thing, through NVML (the ``pynvml`` module of nvidia-ml-py, injectable).
  No library or no driver makes the probe unavailable with one warning, never an exception.
- ``SimStatusProbe``: the simulated daemon's ``GET /status`` JSON (``sim.gpus``), for tests and
  demos on machines without a GPU. Given the simulated machine's GPUs (``sim.machine``), it
  reports them idle while no daemon answers (before the first start, between two), as NVML
  would: the plan knows the GPUs before any daemon runs.
- ``StaticProbe``: fixed devices, for tests and ``plan --gpus N --vram-gib G`` what-ifs.

A sample is plain data: the devices that answered, and a ``GpuFault`` for each one that did not.
NVML calls can block (a GPU in a bad state can stall them), and ``SimStatusProbe`` does HTTP:
call ``sample()`` through ``asyncio.to_thread`` from the event loop.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from cuzk_supervisor.core.bound import GpuActivity

log = structlog.get_logger("supervisor.gpu")

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


class _FirstSeen:
    """Whether an error is new for its device: each distinct error is logged once per device (a
    broken GPU must not flood the log)."""

    def __init__(self) -> None:
        self._seen: set[tuple[int | None, str]] = set()

    def __call__(self, index: int | None, error: str) -> bool:
        if (index, error) in self._seen:
            return False
        self._seen.add((index, error))
        return True


# --------------------------------------------------------------------------------------------
# NVML


def _text(value: str | bytes) -> str:
    # Old bindings return bytes; nvidia-ml-py >= 11.515 returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml_error_text(exc: BaseException) -> str:
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


def no_gpu_activity() -> tuple[GpuActivity, ...]:
    """The activity source where NVML is not the probe."""
    return ()


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
        self._new_error = _FirstSeen()
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
                _nvml_error_text(exc) if nvml is not None else f"{type(exc).__name__}: {exc}"
            )
            log.warning("gpu.watch_disabled", reason="NVML unavailable", error=self._reason)
            return
        self._nvml = nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._reason = _nvml_error_text(exc)
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
                text = _nvml_error_text(exc)
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
            log.warning("gpu.nvml_shutdown_failed", error=_nvml_error_text(exc))


# --------------------------------------------------------------------------------------------
# The simulated daemon's /status


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

    ``url`` is the status URL; a bare ``http://host:port`` gets ``/status`` appended. Only for
    tests and demos: plain ``urllib`` with a short timeout, no retries (the next sample is the
    retry). The probe is always available. Where nothing listens (no daemon running) the sample
    is ``idle_devices`` when they are given (the simulated machine's GPUs, nothing on them),
    else an ``error``; any other failure (a timeout, a bad answer) is an ``error``.
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
        self._new_error = _FirstSeen()
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


# --------------------------------------------------------------------------------------------
# Static


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
