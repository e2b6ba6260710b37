"""GPU probes without a GPU: NVML through a fake module (and the real one, which finds no
driver here), the simulated daemon's /status over loopback HTTP, and the static probe."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from simhelpers import SimProcess, free_tcp_port, write_config
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.machine.gpu import (
    GIB,
    GpuDevice,
    GpuFault,
    GpuProbe,
    StaticProbe,
    total_vram,
)
from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe
from cuzk_supervisor.adapters.machine.gpusimstatus import SimStatusProbe, parse_sim_status


def warnings(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning"]


# --------------------------------------------------------------------------------------------
# A fake pynvml: the real module's error classes and constants, scripted devices.

Failure = Callable[[int, int], BaseException | None]  # (device index, call number) -> error


class FakeNvml:
    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

    def __init__(
        self,
        gpus: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
        init_error: BaseException | None = None,
        memory_error: Failure | None = None,
        v2_error: BaseException | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.memory_error = memory_error
        self.v2_error = v2_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.memory_calls: dict[int, int] = {}
        self.versions: list[int | None] = []
        self.handle_lookups = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self.handle_lookups += 1
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str:
        return self.gpus[handle[1]][0]

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> str:
        return f"GPU-0000-{handle[1]}"

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int], version: int | None = None) -> Any:
        index = handle[1]
        self.versions.append(version)
        if version is not None and self.v2_error is not None:
            raise self.v2_error
        call = self.memory_calls[index] = self.memory_calls.get(index, 0) + 1
        if self.memory_error is not None and (err := self.memory_error(index, call)) is not None:
            raise err
        _, total, used = self.gpus[index]
        return SimpleNamespace(total=total, used=used, free=total - used)


TWO_24G = [("NVIDIA GeForce RTX 4090", 24 * GIB, 2 * GIB), ("NVIDIA GeForce RTX 4090", 24 * GIB, 0)]


# --------------------------------------------------------------------------------------------
# NvmlProbe


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "NVMLError_LibraryNotFound"),
        (pynvml.NVMLError_DriverNotLoaded(), "Driver Not Loaded"),
        (pynvml.NVMLError_Unknown(), "Unknown Error"),
        (pynvml.NVMLError_LibRmVersionMismatch(), "version mismatch"),
        (OSError("libnvidia-ml.so.1: cannot open shared object file"), "cannot open"),
    ],
)
def test_nvml_init_failure_is_unavailable_with_one_warning(error: BaseException, text: str) -> None:
    fake = FakeNvml(TWO_24G, init_error=error)
    with capture_logs() as logs:
        probe = NvmlProbe(fake)
        for _ in range(3):
            assert probe.sample().devices == ()
        assert probe.devices() == []
        probe.shutdown()
    assert not probe.available
    assert text in probe.reason
    assert len(warnings(logs)) == 1
    assert text in warnings(logs)[0]["error"]
    assert fake.init_calls == 1
    assert fake.shutdown_calls == 0  # never initialised: nothing to shut down


def test_nvml_two_gpus() -> None:
    fake = FakeNvml(TWO_24G)
    probe = NvmlProbe(fake, clock=lambda: 7.0)
    assert isinstance(probe, GpuProbe)
    assert probe.available
    assert probe.reason == ""
    assert probe.device_count == 2
    sample = probe.sample()
    assert sample.timestamp == 7.0
    assert sample.faults == ()
    assert sample.error is None
    assert sample.devices == (
        GpuDevice(0, "NVIDIA GeForce RTX 4090", "GPU-0000-0", 24 * GIB, 2 * GIB, 22 * GIB),
        GpuDevice(1, "NVIDIA GeForce RTX 4090", "GPU-0000-1", 24 * GIB, 0, 24 * GIB),
    )
    assert total_vram(sample.devices) == 48 * GIB
    assert set(fake.versions) == {pynvml.nvmlMemory_v2}  # v2 where the bindings have it
    probe.sample()
    assert fake.handle_lookups == 2  # handles and names are looked up once
    assert fake.init_calls == 1
    probe.shutdown()
    probe.shutdown()
    assert fake.shutdown_calls == 1
    assert not probe.available
    assert probe.sample().devices == ()


def test_nvml_device_fault_mid_run_keeps_the_other_device() -> None:
    def lost_on_third(index: int, call: int) -> BaseException | None:
        if index == 1 and 3 <= call <= 5:
            return pynvml.NVMLError_GpuIsLost()
        if index == 1 and call == 6:
            return pynvml.NVMLError_Unknown()
        return None

    fake = FakeNvml(TWO_24G, memory_error=lost_on_third)
    probe = NvmlProbe(fake)
    with capture_logs() as logs:
        first, second, third = probe.sample(), probe.sample(), probe.sample()
    assert [d.index for d in first.devices] == [0, 1]
    assert [d.index for d in second.devices] == [0, 1]
    assert [d.index for d in third.devices] == [0]
    assert third.devices[0].used_bytes == 2 * GIB
    assert third.faults == (GpuFault(1, "NVMLError_GpuIsLost: GPU is lost"),)
    assert len(warnings(logs)) == 1
    assert warnings(logs)[0]["gpu"] == 1

    with capture_logs() as logs:
        fourth, fifth, sixth, seventh = (probe.sample() for _ in range(4))
    assert [f.index for f in fourth.faults + fifth.faults] == [1, 1]
    # The same error again is not logged again; a different one is, once.
    assert [w["error"] for w in warnings(logs)] == ["NVMLError_Unknown: Unknown Error"]
    assert sixth.faults == (GpuFault(1, "NVMLError_Unknown: Unknown Error"),)
    # Back again (with a fresh handle): both devices, no fault.
    assert [d.index for d in seventh.devices] == [0, 1]
    assert seventh.faults == ()
    assert probe.available


def test_nvml_memory_v2_unsupported_falls_back_to_v1() -> None:
    fake = FakeNvml(TWO_24G, v2_error=pynvml.NVMLError_FunctionNotFound())
    probe = NvmlProbe(fake)
    with capture_logs() as logs:
        a, b = probe.sample(), probe.sample()
    assert len(a.devices) == len(b.devices) == 2
    assert a.faults == b.faults == ()
    assert fake.versions == [pynvml.nvmlMemory_v2, None, None, None, None]
    assert [e["log_level"] for e in logs] == ["info"]


def test_nvml_bindings_without_memory_v2_use_v1() -> None:
    class OldBindings(FakeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlMemory_v2":  # bindings older than the v2 struct
                raise AttributeError(name)
            return super().__getattribute__(name)

    fake = OldBindings(TWO_24G)
    probe = NvmlProbe(fake)
    assert len(probe.sample().devices) == 2
    assert fake.versions == [None, None]


def test_nvml_device_count_failure_is_unavailable() -> None:
    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError_Unknown()

    fake = NoCount(TWO_24G)
    with capture_logs() as logs:
        probe = NvmlProbe(fake)
    assert not probe.available
    assert "Unknown Error" in probe.reason
    assert len(warnings(logs)) == 1
    assert fake.shutdown_calls == 1


def test_real_pynvml_on_this_machine_does_not_crash() -> None:
    with capture_logs() as logs:
        probe = NvmlProbe()
        sample = probe.sample()
    try:
        if probe.available:  # a machine with a driver: real devices
            assert probe.device_count == len(sample.devices) + len(sample.faults)
            assert all(d.total_bytes > 0 for d in sample.devices)
        else:  # no driver here: one warning naming the NVML error
            assert sample.devices == ()
            assert probe.reason
            assert len(warnings(logs)) == 1
            assert "NVML" in warnings(logs)[0]["error"]
    finally:
        probe.shutdown()


# --------------------------------------------------------------------------------------------
# SimStatusProbe


def sim_document(*gpus: object) -> dict[str, Any]:  # object: a test passes a bad entry
    return {"status": "ok", "sim": {"rss_simulated_bytes": 0, "gpus": list(gpus)}}


def sim_gpu(index: int, used: int = 0, **extra: Any) -> dict[str, Any]:
    gpu = {
        "index": index,
        "name": "Simulated GPU",
        "vram_total_bytes": 24 * GIB,
        "vram_used_bytes": used,
    }
    return gpu | extra


def test_parse_sim_status() -> None:
    doc = sim_document(sim_gpu(0, used=12 * GIB), sim_gpu(1, fault="GPU is lost"), sim_gpu(2))
    sample = parse_sim_status(doc, 3.0)
    assert sample.timestamp == 3.0
    assert sample.devices == (
        GpuDevice(0, "Simulated GPU", None, 24 * GIB, 12 * GIB, 12 * GIB),
        GpuDevice(2, "Simulated GPU", None, 24 * GIB, 0, 24 * GIB),
    )
    assert sample.faults == (GpuFault(1, "GPU is lost"),)
    flagged = parse_sim_status(sim_document(sim_gpu(0, fault=True)), 0)
    assert flagged.faults == (GpuFault(0, "fault"),)
    assert parse_sim_status(sim_document(sim_gpu(0, fault=False)), 0).faults == ()
    assert parse_sim_status({"status": "ok"}, 0).error == "status has no sim.gpus list"
    broken = parse_sim_status(sim_document({"index": 0, "name": "x"}, "junk"), 0)
    assert broken.devices == ()
    assert [f.index for f in broken.faults] == [0, 1]


@pytest.fixture
def status_server() -> Iterator[tuple[str, list[Any]]]:
    """A loopback HTTP server answering GET /status with the last document in ``docs``."""
    docs: list[Any] = [sim_document()]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/status":
                self.send_error(404)
                return
            body = docs[-1] if isinstance(docs[-1], bytes) else json.dumps(docs[-1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", docs
    finally:
        server.shutdown()
        server.server_close()


def test_sim_status_probe_over_http(status_server: tuple[str, list[Any]]) -> None:
    base, docs = status_server
    probe = SimStatusProbe(base)  # "/status" is appended to a bare address
    assert probe.url == base + "/status"
    assert isinstance(probe, GpuProbe)
    assert probe.available
    docs.append(sim_document(sim_gpu(0, used=GIB), sim_gpu(1)))
    assert [d.used_bytes for d in probe.devices()] == [GIB, 0]
    docs.append(sim_document(sim_gpu(0), sim_gpu(1, fault="injected")))
    with capture_logs() as logs:
        for _ in range(3):
            sample = probe.sample()
    assert [d.index for d in sample.devices] == [0]
    assert sample.faults == (GpuFault(1, "injected"),)
    assert len(warnings(logs)) == 1
    docs.append(b"not json")
    assert probe.sample().error is not None
    probe.shutdown()


def test_sim_status_probe_unreachable() -> None:
    probe = SimStatusProbe(f"http://127.0.0.1:{free_tcp_port()}/status", timeout_s=0.5)
    with capture_logs() as logs:
        a, b = probe.sample(), probe.sample()
    assert a.devices == b.devices == ()
    assert a.error is not None
    assert "Connection refused" in a.error or "URLError" in a.error
    assert len(warnings(logs)) == 1


def test_sim_status_probe_against_the_simulated_daemon(tmp_path: Path) -> None:
    port = free_tcp_port()
    sim = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}",
        config=write_config(tmp_path, daemon={"status_listen": f"127.0.0.1:{port}"}),
        args=["--gpus", "2"],
    )
    try:
        sample = SimStatusProbe(f"http://127.0.0.1:{port}/status").sample()
    finally:
        sim.kill()
    assert sample.error is None
    assert [d.index for d in sample.devices] == [0, 1]
    assert all(d.total_bytes == 24 * GIB for d in sample.devices)
    assert all(d.free_bytes == d.total_bytes - d.used_bytes for d in sample.devices)


# --------------------------------------------------------------------------------------------
# StaticProbe


def test_static_probe_what_if() -> None:
    probe = StaticProbe.uniform(2, 48)
    assert isinstance(probe, GpuProbe)
    assert probe.available
    assert [d.total_bytes for d in probe.devices()] == [48 * GIB, 48 * GIB]
    assert [d.index for d in probe.sample().devices] == [0, 1]
    faulty = StaticProbe([], [GpuFault(0, "lost")], clock=lambda: 1.0)
    assert faulty.sample().faults == (GpuFault(0, "lost"),)
    assert faulty.sample().timestamp == 1.0
    faulty.shutdown()


# --------------------------------------------------------------------------------------------
# NvmlProbe.activity: the bench's evidence (issue 25)


class ActiveNvml(FakeNvml):
    """FakeNvml with utilisation, SM clocks and clocks event reasons; GPU 1 reports none of
    them (NOT_SUPPORTED), as an old card or driver does."""

    def __init__(self, mask: int, *, renamed: bool = True) -> None:
        super().__init__(TWO_24G)
        self.mask = mask
        if renamed:  # newer bindings name it "event reasons"
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    def _unsupported(self, handle: tuple[str, int]) -> None:
        if handle[1] == 1:
            raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetUtilizationRates(self, handle: tuple[str, int]) -> Any:
        self._unsupported(handle)
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetClockInfo(self, handle: tuple[str, int], kind: int) -> int:
        self._unsupported(handle)
        assert kind == pynvml.NVML_CLOCK_SM
        return 1500

    def nvmlDeviceGetMaxClockInfo(self, handle: tuple[str, int], kind: int) -> int:
        self._unsupported(handle)
        return 2000

    def _reasons(self, handle: tuple[str, int]) -> int:
        self._unsupported(handle)
        return self.mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: tuple[str, int]) -> int:
        return self._reasons(handle)


@pytest.mark.parametrize("renamed", [True, False])
def test_activity_reads_utilisation_clocks_and_the_reasons_that_hold_clocks_down(renamed: bool):
    mask = (
        pynvml.nvmlClocksThrottleReasonSwPowerCap
        | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
        | pynvml.nvmlClocksThrottleReasonGpuIdle  # not a slowdown: left out
    )
    first, second = NvmlProbe(ActiveNvml(mask, renamed=renamed)).activity()
    assert (first.index, first.utilisation, first.sm_clock_ratio) == (0, 0.97, 0.75)
    assert first.slowdowns == ("power-cap", "hw-thermal")
    # A GPU that reports none of it: figures None, never an error.
    assert (second.index, second.utilisation, second.sm_clock_ratio) == (1, None, None)
    assert second.slowdowns == ()


def test_no_activity_without_nvml():
    assert NvmlProbe(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound())).activity() == ()
