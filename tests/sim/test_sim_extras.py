"""Fault switches for the fault matrix: once across restarts, a GPU lost mid-run (one condition
however it is named: the daemon's status and the fake NVML agree), and a cgroup-like
memory.current that follows the simulated allocations."""

from __future__ import annotations

import json
import urllib.request

import pynvml
import pytest
from simhelpers import SimProcess, free_tcp_port, poll_until, write_config

from cuzk_supervisor.sim.faults import FaultSpecError, parse_fault
from cuzk_supervisor.sim.machine.fakenvml import FakeNvml, GpuStateFile


def test_once_and_gpu_fault_parse():
    spec = parse_fault("exit:3,at_partition=2,once=/tmp/marker")
    assert spec.once == "/tmp/marker"
    assert spec.at_partition == 2
    older = parse_fault("gpu-fault:1,after_s=2")  # the older name of gpu-lost
    assert (older.kind, older.number, older.text) == ("gpu-lost", 1, "gpu-fault:1,after_s=2")
    for bad in ("exit:3,once=relative", "gpu-fault"):
        try:
            parse_fault(bad)
        except FaultSpecError:
            continue
        raise AssertionError(f"{bad!r} should not parse")


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
        return json.load(response)


def test_once_fires_in_one_life_only_and_a_lost_gpu_shows_in_status_and_nvml(tmp_path):
    marker = tmp_path / "fired"
    gpus_dir = tmp_path / "gpus"
    gpus_dir.mkdir()
    status_port = free_tcp_port()
    config = write_config(tmp_path, daemon={"status_listen": f"127.0.0.1:{status_port}"})
    args = ["--fault", f"exit:7,once={marker}", "--gpus", "2"]
    first = SimProcess.start(listen=f"127.0.0.1:{free_tcp_port()}", config=config, args=args,
                             ready=False)  # fmt: skip
    try:
        assert first.wait(20) == 7
        assert marker.exists()
    finally:
        first.kill()
    second = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}", config=config,
        args=[*args, "--gpu-dir", str(gpus_dir), "--fault", "gpu-fault:1,after_s=0.2"],
    )  # fmt: skip
    try:
        gpus = poll_until(
            lambda: (g := _status(status_port)["sim"]["gpus"]) and "fault" in g[1] and g,
            10, what="GPU 1 faulted",
        )  # fmt: skip
        assert "fault" not in gpus[0]
        assert "GpuIsLost" in gpus[1]["fault"]
        # The fake NVML, reading the same folder, cannot read GPU 1 either.
        nvml = FakeNvml(2, GpuStateFile(gpus_dir, 2))
        nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetHandleByIndex(1)
        assert second.proc.poll() is None  # the marker stopped the exit this time
    finally:
        second.kill()


def test_memory_current_follows_the_simulated_allocations(tmp_path):
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    sim = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}",
        config=write_config(
            tmp_path, srs={"param_cache": str(tmp_path / "p"), "preload": ["porep-32g"]}
        ),
        args=["--cgroup-dir", str(cgroup)],
    )
    try:
        current = int((cgroup / "memory.current").read_text())
        # The SRS is resident after start: 44 simulated GiB at 1 MiB per GiB.
        assert 40 * 2**20 <= current <= 50 * 2**20
    finally:
        sim.kill()
