"""The GPUs' health through NVML (issue 34), against a fake pynvml (``sim.machine.fakenvml``,
pynvml's
own error classes and constants): the event set's XIDs (79, 48, 63, 94), the ECC counters and
retired pages, a device lost, a GPU without ECC, clocks, and NVML missing altogether."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest
import structlog

from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe
from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth
from cuzk_supervisor.core.health import (
    ECC,
    GPU_LOST,
    PAGES_RETIRED,
    HealthState,
    Level,
    assess,
)
from cuzk_supervisor.core.healthevidence import Observation
from cuzk_supervisor.core.healthpolicy import HealthPolicy
from cuzk_supervisor.sim.machine.fakenvml import FakeNvml, GpuStateFile
from cuzk_supervisor.sim.machine.gpustate import GpuState


def machine(gpus: int = 2, **kwargs: Any) -> tuple[GpuState, FakeNvml]:
    state = GpuState(gpus=gpus)
    return state, FakeNvml(gpus, lambda: state, **kwargs)


def test_each_xid_comes_once_through_the_event_set_with_its_ecc_and_pages() -> None:
    state, fake = machine()
    state.xid(1, 63)  # before the watch began: not an event it sees
    health = NvmlHealth(fake)
    first = health.read()
    assert [v.xids for v in first] == [(), ()]
    assert (first[1].retired_pages, first[1].retirement_pending) == (1, True)
    state.xid(0, 48)
    state.xid(0, 94)
    state.xid(1, 63)
    views = health.read()
    assert [v.xids for v in views] == [(48, 94), (63,)]
    assert (views[0].ecc_uncorrected, views[0].retired_pages) == (2, 1)
    assert views[1].retired_pages == 2
    assert [v.xids for v in health.read()] == [(), ()]  # delivered once


def test_a_gpu_that_fell_off_the_bus_says_xid_79_then_stops_answering() -> None:
    state, fake = machine()
    health = NvmlHealth(fake)
    state.lose(1)
    views = health.read()
    assert views[0].answering
    lost = views[1]
    assert (lost.answering, lost.xids) == (False, (79,))
    assert "GPU is lost" in lost.error
    again = health.read()[1]
    assert (again.answering, again.xids) == (False, ())
    _, assessment = assess(HealthPolicy(), HealthState(), Observation(0.0, gpus=views))
    assert {(f.kind, f.level, f.gpu) for f in assessment.findings} == {(GPU_LOST, Level.BROKEN, 1)}


def test_the_views_feed_the_policys_ecc_and_page_findings() -> None:
    state, fake = machine(gpus=1)
    health = NvmlHealth(fake)
    memory, _ = assess(HealthPolicy(), HealthState(), Observation(0.0, gpus=health.read()))
    state.xid(0, 48)
    _, assessment = assess(HealthPolicy(), memory, Observation(30.0, gpus=health.read()))
    found = {f.kind: f for f in assessment.findings}
    assert found[ECC].level is Level.DEGRADED
    assert "XID 48" in found[ECC].reason
    assert found[PAGES_RETIRED].level is Level.DEGRADED


def test_a_gpu_that_remaps_rows_reports_them_as_retired() -> None:
    state, fake = machine(gpus=1, remaps_rows=True)
    health = NvmlHealth(fake)
    assert health.read()[0].retired_pages == 0
    state.xid(0, 48)
    view = health.read()[0]
    assert (view.retired_pages, view.retirement_pending, view.remap_failed) == (1, True, False)
    fake.nvmlDeviceGetRemappedRows = lambda handle: (0, 1, 0, 1)  # type: ignore[method-assign]
    assert health.read()[0].remap_failed


def test_a_gpu_without_ecc_reports_none_and_still_its_xids() -> None:
    state, fake = machine(gpus=1, ecc=False)
    health = NvmlHealth(fake)
    state.xid(0, 63)  # a page retirement recorded
    view = health.read()[0]
    assert (view.ecc_uncorrected, view.retired_pages, view.retirement_pending) == (None, None, None)
    assert view.xids == (63,)


def test_clocks_idle_and_busy_and_held_down() -> None:
    busy: set[int] = set()
    state = GpuState(gpus=1)
    health = NvmlHealth(FakeNvml(1, lambda: state, busy=lambda: frozenset(busy)))
    idle = health.read()[0]
    assert (idle.utilisation, idle.sm_clock_ratio, idle.slowdowns) == (0.0, 0.2, ())
    busy.add(0)
    assert health.read()[0].sm_clock_ratio == 1.0
    state.throttle(0, 0.45, "power-cap")
    held = health.read()[0]
    assert (held.utilisation, held.slowdowns) == (1.0, ("power-cap",))
    assert held.sm_clock_ratio == pytest.approx(0.45, abs=0.01)


def test_the_condition_file_is_what_the_fake_reads(tmp_path) -> None:
    writer = GpuState.load(tmp_path, 1)
    reader = GpuStateFile(tmp_path, 1)
    health = NvmlHealth(FakeNvml(1, reader))
    assert health.read()[0].answering
    writer.xid(0, 94)
    assert health.read()[0].xids == (94,)
    again = GpuState.load(tmp_path, 1)  # a daemon started later sees what came before
    assert again.condition(0).ecc_uncorrected == 1
    writer.lose(0)
    assert not health.read()[0].answering


def test_without_nvml_the_reads_are_off_with_one_warning() -> None:
    class Missing:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with structlog.testing.capture_logs() as logs:
        health = NvmlHealth(Missing())
    assert not health.available
    assert health.read() == ()
    assert [e["event"] for e in logs] == ["health.nvml_unavailable"]


def test_a_device_refusing_events_is_read_without_them() -> None:
    state, fake = machine(gpus=1)

    def refuse(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    fake.nvmlDeviceRegisterEvents = refuse  # type: ignore[method-assign,assignment]
    with structlog.testing.capture_logs() as logs:
        health = NvmlHealth(fake)
    assert [e["event"] for e in logs] == ["health.nvml_events_off"]
    state.xid(0, 48)
    view = health.read()[0]
    assert (view.xids, view.ecc_uncorrected) == ((), 1)


def test_the_probe_reads_the_same_fake() -> None:
    state, fake = machine(gpus=2)
    probe = NvmlProbe(fake)
    assert [d.index for d in probe.devices()] == [0, 1]
    state.lose(0)
    sample = probe.sample()
    assert [f.index for f in sample.faults] == [0]
