"""The simulated machine (issue 14.7): its GPUs and RAM are known to the plan before any daemon
runs, the demo's happy path warns nothing and logs each event once, and what the simulated
daemon would refuse at its start is refused by ``sim`` at once (issue 14.2)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from simhelpers import quick_sim
from structlog.testing import capture_logs

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.machine.gpusimstatus import SimStatusProbe
from cuzk_supervisor.daemon.simulated import sim_daemon_argv
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.machine import GIB, MIB, SimMachine, check_daemon_argv

# --- the description, read from the daemon's arguments --------------------------------------


def test_the_machine_is_read_from_the_simulated_daemons_arguments() -> None:
    argv = ["--time-scale", "100", "--gpus", "2", "--vram-gib", "8", "--host-gib", "256",
            "--memory-scale", "4", "--fault", "exit:3"]  # fmt: skip
    machine = SimMachine.from_daemon_argv(argv, {})
    assert (machine.gpus, machine.vram_gib, machine.host_gib) == (2, 8.0, 256.0)
    devices = machine.gpu_devices()
    assert [d.index for d in devices] == [0, 1]
    assert all(d.total_bytes == d.free_bytes == 8 * GIB and d.used_bytes == 0 for d in devices)
    assert machine.host_total_bytes == 256 * 4 * MIB  # real bytes: 4 MiB per simulated GiB
    assert machine.simulated_mem_total == 256 * GIB
    assert "2 GPUs of 8 GiB VRAM, 256 GiB RAM" in machine.describe()
    assert "4 real MiB" in machine.describe()  # the scale, named once


def test_the_environment_gives_the_defaults_as_for_the_daemon() -> None:
    machine = SimMachine.from_daemon_argv([], {"CUZK_SIM_GPUS": "3", "CUZK_SIM_VRAM_GIB": "48"})
    assert (machine.gpus, machine.vram_gib, machine.host_gib) == (3, 48.0, None)
    assert machine.host_total_bytes is None


@pytest.mark.parametrize(
    ("binary", "args", "expected"),
    [
        (sys.executable, ["-m", "cuzk_supervisor.sim.daemon", "--gpus", "2"], ["--gpus", "2"]),
        ("/usr/local/bin/cuzk-sim-daemon", ["--gpus", "2"], ["--gpus", "2"]),
        ("/usr/local/bin/cuzk", ["--gpus", "2"], None),
        (sys.executable, ["-m", "other.module"], None),
    ],
)
def test_the_simulator_is_recognised_by_its_command(
    binary: str, args: list[str], expected: list[str] | None
) -> None:
    assert sim_daemon_argv(binary, args) == expected


@pytest.mark.parametrize(
    ("argv", "environ", "fragment"),
    [
        (["--fault", "bogus"], {}, "unknown fault kind 'bogus'"),
        ([], {"CUZK_SIM_FAULTS": "exit:x"}, "is not a number"),
        (["--gpus", "0"], {}, "--gpus must be >= 1"),
        (["--gpus", "two"], {}, "invalid int value"),
        (["--vram-gib", "-1"], {}, "--vram-gib"),
        (["--host-gib", "0.5"], {}, "--host-gib"),
    ],
)
def test_what_the_daemon_would_refuse_is_one_usage_line(
    argv: list[str], environ: dict[str, str], fragment: str
) -> None:
    with pytest.raises(UsageError) as caught:
        check_daemon_argv(argv, environ)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_simulated_ram_is_the_hosts_with_the_daemons_allocations_used(
    tmp_path: Path,
) -> None:
    machine = SimMachine(host_gib=512, memory_scale=1.0, cgroup_dir=tmp_path)
    assert machine.host_memory().used == 0  # no memory.current yet: nothing allocated
    (tmp_path / "memory.current").write_text(f"{100 * MIB}\n")
    host = machine.host_memory()
    assert (host.total, host.used, host.available) == (512 * MIB, 100 * MIB, 412 * MIB)


# --- the GPU probe before any daemon runs -------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_with_no_daemon_the_machines_gpus_are_idle_and_nothing_is_warned() -> None:
    """Before: the plan asked the simulated daemon's /status before any daemon ran, warned
    ``sim gpu status failed ... Connection refused`` (now ``gpu.sim_status_failed``) and planned
    with 0 GPUs."""
    machine = SimMachine(gpus=2, vram_gib=24)
    probe = SimStatusProbe(
        f"http://127.0.0.1:{_closed_port()}/status", idle_devices=machine.gpu_devices()
    )
    with capture_logs() as logs:
        sample = probe.sample()
        devices = probe.devices()
    assert sample.error is None
    assert [d.total_bytes for d in devices] == [24 * GIB, 24 * GIB]
    assert logs == []


def test_without_the_machine_an_unreachable_status_is_still_an_error() -> None:
    probe = SimStatusProbe(f"http://127.0.0.1:{_closed_port()}/status")
    with capture_logs() as logs:
        sample = probe.sample()
    assert sample.error is not None
    assert sample.devices == ()
    assert [e["event"] for e in logs] == ["gpu.sim_status_failed"]


# --- the demo, end to end ------------------------------------------------------------------------


def _sim(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_")}
    cmd = [sys.executable, "-m", "cuzk_supervisor", "sim", "--fresh", "--exit-after-run",
           "--sim-dir", str(tmp_path / "sim"), "--log-format", "json",
           "--health-listen", "127.0.0.1:0", *quick_sim(), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _events(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    lines = (done.stdout + "\n" + done.stderr).splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.slow
def test_the_demo_plans_with_the_simulated_machine_warns_nothing_and_logs_each_event_once(
    tmp_path: Path,
) -> None:
    done = _sim(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    events = _events(done)
    loud = [e for e in events if e.get("level") in ("warning", "error", "critical")]
    assert loud == [], loud
    (plan,) = [e for e in events if e["event"] == "plan.made"]
    # The GPU is known at plan time, the RAM is the simulated machine's in simulated GiB.
    assert "1 GPU(s)" in plan["summary"]
    assert "host 512 GiB" in plan["summary"]
    (result,) = [e for e in events if e["event"] == "bench.result"]
    assert (result["gpus"], result["vram_gib"]) == (1, [24.0])
    assert "machine 1 GPU of 24 GiB VRAM, 512 GiB RAM" in done.stdout  # the scale named once
    names = [e["event"] for e in events]
    assert "pid1.reaped" not in names  # one exit was logged as reaped and orphan_reaped
    assert all(e["terminated"] for e in events if e["event"] == "pid1.tree_stopped")
    exited = [e for e in events if e["event"] == "daemon.exited"]
    assert len(exited) == 2  # the warmup daemon and the full one
    assert all(e["peak_rss_bytes"] > 0 for e in exited)


@pytest.mark.slow
def test_gpus_below_the_vram_need_are_refused_by_the_plan(tmp_path: Path) -> None:
    """The VRAM rule, end to end: the simulated machine's GPUs reach the plan."""
    done = _sim(tmp_path, "--vram-gib", "8")
    assert done.returncode == exitcodes.OUT_OF_MEMORY, done.stderr[-3000:]
    events = _events(done)
    failed = [e for e in events if e["event"] == "lifecycle.failed"]
    assert "no usable GPU" in failed[0]["reason"]
    assert "8 GiB" in failed[0]["reason"]
    assert not any(e["event"] == "daemon.spawned" for e in events)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--sim-fault", "bogus"), "unknown fault kind 'bogus'"),
        (("--gpus", "0"), "--gpus must be >= 1"),
    ],
)
def test_what_the_simulated_daemon_would_refuse_exits_2_before_anything(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    """``sim --sim-fault bogus`` crash-looped the daemon five times for 15 s and exited 4."""
    done = _sim(tmp_path, *args, timeout=10)
    assert done.returncode == exitcodes.USAGE, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert fragment in done.stderr
    assert done.stdout == ""  # no manager started, nothing announced
    assert not (tmp_path / "sim").exists()  # nothing written


def test_the_simulated_daemon_refuses_a_missing_cgroup_dir_at_its_start(tmp_path: Path) -> None:
    """Before, it started, served, and died at its first allocation (then at every restart)."""
    missing = tmp_path / "no-such-cgroup"
    machine = SimMachine.from_daemon_argv(["--cgroup-dir", str(missing)], {})
    assert machine.problem() is None  # the arguments are fine: `sim` makes the folder later
    assert machine.folder_problem() == (
        f"--cgroup-dir {missing}: no such directory (the simulated daemon keeps its "
        "memory.current there)"
    )
    done = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor.sim.daemon", "--cgroup-dir", str(missing)],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # as the Rust daemon exits on an error from main
    assert "Error: invalid arguments" in done.stderr
    assert "no such directory" in done.stderr
    missing.mkdir()
    assert machine.folder_problem() is None
