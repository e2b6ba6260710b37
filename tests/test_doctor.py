"""``cuzk-supervisor doctor``: a machine prepared in tmp_path passes; each broken edge fails
with the row that names it. In-process with injected probes, plus the CLI as a subprocess."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.machine.cgroupfind import CgroupLocation
from cuzk_supervisor.adapters.machine.gpu import GpuDevice, GpuFault, StaticProbe
from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe
from cuzk_supervisor.adapters.machine.resources import HostMemory, MemorySampler
from cuzk_supervisor.adapters.state.doc import SupervisorState
from cuzk_supervisor.address import Address, free_loopback_port
from cuzk_supervisor.cli import doctor, prestart
from cuzk_supervisor.cli.commands import doctor as doctor_command
from cuzk_supervisor.cli.doctor import (
    PARAMS_BYTES,
    PCE_FILES_BYTES,
    REQUIRED_FREE_BYTES,
    CheckResult,
    GpuFacts,
    Probes,
    Verdict,
)
from cuzk_supervisor.cli.main import build_parser
from cuzk_supervisor.cli.simhandoff import machine_for
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[1]


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def free_disk(free: int) -> Callable[[Path], Usage]:
    """A ``disk_usage`` probe: a disk of ``free`` bytes, all of them free."""
    return lambda path: Usage(free, 0, free)


def write_c1(path: Path) -> Path:
    phase1 = base64.b64encode(b'{"registered_proof": "StackedDrg32GiBV1_1"}').decode()
    path.write_text(json.dumps({"SectorNum": 1, "Phase1Out": phase1, "SectorSize": 32 * GIB}))
    return path


def fixture_sampler(host_gib: float) -> Callable[[Settings], MemorySampler]:
    """The sampler reading the ``cgroup_root`` fixture folder, on a host of ``host_gib``."""
    total = int(host_gib * GIB)

    def make(s: Settings) -> MemorySampler:
        assert s.cgroup_root is not None
        location = CgroupLocation(2, s.cgroup_root, s.cgroup_root)
        return MemorySampler(
            proc_root=s.proc_root,
            cgroup=location,
            discover=False,
            host=lambda: HostMemory(total=total, available=total, used=0),
        )

    return make


@dataclass
class Machine:
    """A proving machine laid out in tmp_path: every edge healthy until a test breaks one."""

    root: Path
    flags: dict[str, str]
    probes: Probes

    def settings(self, **overrides: str) -> Settings:
        return settings.load({**self.flags, **overrides}, environ={}).settings

    def check(self, probes: Probes | None = None, **overrides: str) -> list[CheckResult]:
        return doctor.run_checks(self.settings(**overrides), probes or self.probes)

    def argv(self, **overrides: str) -> list[str]:
        out: list[str] = []
        for name, value in {**self.flags, **overrides}.items():
            out += ["--" + name.replace("_", "-"), value]
        return out

    def set_cgroup_limit(self, n_bytes: int) -> None:
        (self.root / "cgroup" / "memory.max").write_text(f"{n_bytes}\n")


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    binary = tmp_path / "bin" / "cuzk"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{384 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{1 * GIB}\n")
    (tmp_path / "params").mkdir()
    flags = {
        "daemon_binary": str(binary),
        "cgroup_root": str(cgroup),
        "gpu_probe": "nvml",
        "state_dir": str(tmp_path / "state"),
        "run_dir": str(tmp_path / "run"),
        "log_dir": str(tmp_path / "log"),
        "daemon_param_cache": str(tmp_path / "params"),
        "daemon_status_listen": f"127.0.0.1:{free_loopback_port()}",
        "health_listen": f"127.0.0.1:{free_loopback_port()}",
        "c1_file": str(write_c1(tmp_path / "c1.json")),
    }
    probes = Probes(
        gpu_probe=lambda s: StaticProbe.uniform(2, 24, name="NVIDIA GeForce RTX 3090"),
        memory_sampler=fixture_sampler(512),
        disk_usage=lambda path: Usage(1000 * GIB, 0, 500 * GIB),
    )
    return Machine(tmp_path, flags, probes)


def rows(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def failing(results: list[CheckResult]) -> list[str]:
    return [r.name for r in results if r.verdict is Verdict.FAIL]


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A loopback port something already listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def run_command(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    probes: Probes | None = None, **overrides: str,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """``doctor --json`` in-process through the real parser, with the machine's probes."""
    monkeypatch.setattr(doctor_command, "configure_logging", lambda level: None)
    for name in list(os.environ):
        if name.startswith(settings.ENV_PREFIX):
            monkeypatch.delenv(name)
    args = build_parser().parse_args(["doctor", "--json", *machine.argv(**overrides)])
    rc = doctor_command.main(args, probes or machine.probes)
    return rc, json.loads(capsys.readouterr().out)


# --- the whole command ------------------------------------------------------------------------


def test_a_prepared_machine_passes_with_a_warning_for_the_local_run(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, document = run_command(machine, monkeypatch, capsys)
    assert rc == 0, document
    assert document["overall"] == "warn"
    by_name = {row["name"]: row for row in document["checks"]}
    assert list(by_name) == [
        "daemon_binary", "gpus", "vram", "memory", "disk", "state_dir", "run_dir", "log_dir",
        "daemon_listen", "daemon_status_listen", "health_listen", "manager", "c1_file",
    ]  # fmt: skip
    verdicts = {name: row["verdict"] for name, row in by_name.items()}
    assert verdicts == {**dict.fromkeys(by_name, "ok"), "manager": "warn"}
    assert "local run" in by_name["manager"]["detail"]
    assert by_name["gpus"]["detail"] == "2 GPU(s): 2 × NVIDIA GeForce RTX 3090"
    # 384 GiB cgroup below a 512 GiB host: 384 − 25 % = 288 GiB → (288 − 69) // 20 = 10.
    assert "cgroup 384 GiB" in by_name["memory"]["detail"]
    assert "10 workers (warmup 2), total_budget 210 GiB" in by_name["memory"]["detail"]
    assert by_name["state_dir"]["detail"] == (
        f"{machine.root / 'state'} will be created (in {machine.root}, writable)"
    )
    assert not (machine.root / "state").exists(), "doctor only looks"
    assert not (machine.root / "run").exists(), "doctor only looks"
    assert not list((machine.root / "params").iterdir()), "the write probe left a file"


def test_the_table_names_every_row_and_the_exit_status(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor_command, "configure_logging", lambda level: None)
    argv = ["doctor", *machine.argv(daemon_binary=str(machine.root / "missing"))]
    assert doctor_command.main(build_parser().parse_args(argv), machine.probes) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["check", "verdict", "detail"]
    assert "daemon_binary         fail     daemon binary" in out
    assert out.rstrip().endswith("overall: fail (exit 1)")


# --- each failure, with its row -----------------------------------------------------------------


def test_a_missing_binary_fails_its_row(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = machine.root / "bin" / "nope"
    rc, document = run_command(machine, monkeypatch, capsys, daemon_binary=str(missing))
    assert rc == 1
    assert document["overall"] == "fail"
    bad = [row for row in document["checks"] if row["verdict"] == "fail"]
    assert bad == [
        {"name": "daemon_binary", "verdict": "fail", "detail": f"daemon binary {missing} not found"}
    ]


def test_doctor_creates_no_folder_on_a_clean_machine(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A temp root where none of the folders exist yet: each is reported, none is made."""
    fresh = machine.root / "fresh"
    folders = {
        "state_dir": fresh / "var" / "lib" / "cuzk-supervisor",
        "run_dir": fresh / "run" / "cuzk-supervisor",
        "log_dir": fresh / "var" / "log" / "cuzk-supervisor",
        "daemon_param_cache": fresh / "data" / "zk" / "params",
    }
    before = sorted(machine.root.rglob("*"))
    overrides = {name: str(path) for name, path in folders.items()}
    _, document = run_command(machine, monkeypatch, capsys, probes=machine.probes, **overrides)
    by_name = {row["name"]: row for row in document["checks"]}
    for name in ("state_dir", "run_dir", "log_dir"):
        assert by_name[name]["verdict"] == "ok"
        assert (
            by_name[name]["detail"]
            == f"{folders[name]} will be created (in {machine.root}, writable)"
        )
    # The socket goes in run_dir, made later: its folder is not a problem (a long tmp_path may
    # still make the socket path too long for the kernel, another row's business).
    assert "not writable" not in by_name["daemon_listen"]["detail"]
    assert by_name["disk"]["verdict"] == "ok"  # the param cache: checked at its nearest parent
    assert not fresh.exists()
    assert sorted(machine.root.rglob("*")) == before, "doctor wrote something"


def test_a_folder_under_a_read_only_parent_cannot_be_created(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor.probes.os, "access", lambda path, mode, **kw: False)
    results = machine.check(state_dir=str(machine.root / "nope" / "state"))
    row = rows(results)["state_dir"]
    assert row.verdict is Verdict.FAIL
    assert (
        row.detail
        == f"{machine.root / 'nope' / 'state'} cannot be created: {machine.root}: not writable"
    )
    assert not (machine.root / "nope").exists()


def test_a_binary_without_the_execute_bit_fails(machine: Machine) -> None:
    plain = machine.root / "bin" / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    results = machine.check(daemon_binary=str(plain))
    assert failing(results) == ["daemon_binary"]
    assert "not executable" in rows(results)["daemon_binary"].detail


def test_a_binary_name_is_looked_up_on_path(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(machine.root / "bin"))
    assert rows(machine.check(daemon_binary="cuzk"))["daemon_binary"].verdict is Verdict.OK
    detail = rows(machine.check(daemon_binary="cuzk-daemon"))["daemon_binary"].detail
    assert detail == "daemon binary 'cuzk-daemon' not found on PATH"


def test_a_small_disk_fails_with_what_it_needs(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small = replace(machine.probes, disk_usage=lambda path: Usage(10 * GIB, 9 * GIB, 1 * GIB))
    rc, document = run_command(machine, monkeypatch, capsys, probes=small)
    assert rc == 1
    row = next(r for r in document["checks"] if r["name"] == "disk")
    assert row["verdict"] == "fail"
    assert row["detail"].startswith(f"only 1 GiB free at {machine.root / 'params'}, needs 125 GiB")
    assert [r["name"] for r in document["checks"] if r["verdict"] == "fail"] == ["disk"]


def test_parameters_already_present_lower_the_disk_need(machine: Machine) -> None:
    # A sparse file stands for the fetched parameters: its size counts, no space is used.
    with open(machine.root / "params" / "porep.params", "wb") as f:
        f.truncate(PARAMS_BYTES)
    expected = f"porep.params:{PARAMS_BYTES}"
    probes = replace(machine.probes, disk_usage=lambda path: Usage(40 * GIB, 0, 30 * GIB))
    row = rows(machine.check(probes, params_expected=expected))["disk"]
    assert row.verdict is Verdict.OK, row
    assert "needs 25 GiB" in row.detail
    assert "100 GiB already present" in row.detail
    # Without the declaration the same 30 GiB is not enough.
    assert rows(machine.check(probes))["disk"].verdict is Verdict.FAIL


def test_doctor_sees_the_simulated_machine_before_any_daemon_runs(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: doctor asked the simulated daemon's /status, where nothing listens before a run
    ("sim probe failed: ... Connection refused"), and planned from this host's RAM, where
    ``run`` plans from the simulated machine: its GPUs (idle) and its ``--host-gib`` RAM."""
    for name in list(os.environ):
        if name.startswith("CUZK_SIM_"):
            monkeypatch.delenv(name)

    def simulated(vram_gib: int) -> Settings:
        args = f"-m cuzk_supervisor.sim.daemon --gpus 2 --vram-gib {vram_gib} --host-gib 256"
        return machine.settings(daemon_binary=sys.executable, daemon_args=args, gpu_probe="sim",
                                plan_memory_scale="1024", cgroup_root="")  # fmt: skip

    # The GPU probe and the sampler doctor is handed when the daemon is the simulator.
    probes = replace(Probes.of(machine_for(simulated(24))), disk_usage=machine.probes.disk_usage)
    gpus = doctor.gather_gpus(simulated(24), probes)
    assert gpus.error is None
    assert [d.total_bytes for d in gpus.devices] == [24 * GIB, 24 * GIB]
    by_name = rows(doctor.run_checks(simulated(24), probes))
    assert (by_name["gpus"].verdict, by_name["vram"].verdict) == (Verdict.OK, Verdict.OK)
    memory = by_name["memory"].detail
    assert memory.startswith("host 256 GiB, no cgroup limit: 6 workers"), memory
    assert "sizes are simulated GiB" in memory  # the scale, named once
    # The VRAM rule, end to end: GPUs too small for a proof refuse the plan.
    small = rows(doctor.run_checks(simulated(8), probes))
    assert (small["vram"].verdict, small["memory"].verdict) == (Verdict.FAIL, Verdict.FAIL)
    assert "less than the 12 GiB VRAM a proof needs" in small["memory"].detail


def test_the_disk_check_counts_what_a_previous_run_left(machine: Machine) -> None:
    """Before: doctor asked for 125 GiB on a machine whose state file says the parameters are
    verified and the PCE files built, where ``run`` itself needs nothing more."""
    state = machine.root / "state"
    state.mkdir()
    left = SupervisorState(params_verified=True, pce_ready=True)
    (state / doctor.STATE_FILE).write_text(left.to_json())
    probes = replace(machine.probes, disk_usage=lambda path: Usage(10 * GIB, 9 * GIB, 1 * GIB))
    row = rows(machine.check(probes))["disk"]
    assert row.verdict is Verdict.OK, row
    assert row.detail.endswith(
        "writable; needs nothing more (parameters verified by an earlier run; "
        "PCE files built by an earlier run)"
    ), row.detail


@pytest.mark.parametrize("scale", ["1", "1024"])
def test_doctor_and_the_check_before_run_refuse_the_same_disk(machine: Machine, scale: str) -> None:
    """Before: against the simulator (``plan_memory_scale`` 1024) doctor asked for the real
    125 GiB where ``run`` asks for 125 MiB: on a small disk doctor failed a run that starts."""
    with open(machine.root / "params" / "a.params", "wb") as f:
        f.truncate(1000)
    s = machine.settings(plan_memory_scale=scale, params_expected="a.params:1000")
    (machine.root / "state").mkdir()
    (machine.root / "state" / doctor.STATE_FILE).write_text(
        SupervisorState(pce_ready=True).to_json()
    )
    need = prestart.disk_needed(s, prestart.previous_state(s))
    assert need == -(-(100 * GIB - 1000 * int(scale)) // int(scale))  # the PCE files are built
    for free, verdict in ((need, Verdict.OK), (need - 1, Verdict.FAIL)):
        room = replace(machine.probes, disk_usage=free_disk(free))
        assert rows(doctor.run_checks(s, room))["disk"].verdict is verdict, (scale, free)
        refused = free < need
        try:
            prestart.check_disk(s, free_disk(free))
        except UsageError:
            assert refused
        else:
            assert not refused
    detail = rows(doctor.run_checks(s, machine.probes))["disk"].detail
    assert ("plan_memory_scale" in detail) is (scale != "1"), detail


def test_a_missing_param_cache_is_checked_at_its_nearest_parent(machine: Machine) -> None:
    cache = machine.root / "data" / "zk" / "params"
    seen: list[Path] = []

    def usage(path: Path) -> Usage:
        seen.append(path)
        return Usage(1000 * GIB, 0, 500 * GIB)

    probes = replace(machine.probes, disk_usage=usage)
    row = rows(machine.check(probes, daemon_param_cache=str(cache)))["disk"]
    assert row.verdict is Verdict.OK
    assert seen == [machine.root]
    assert f"nearest existing parent of {cache}" in row.detail
    assert not cache.parent.exists(), "doctor must not create the param cache"


def test_an_unwritable_param_cache_fails(machine: Machine) -> None:
    blocker = machine.root / "blocker"
    blocker.write_text("a file where a folder should be")
    row = rows(machine.check(daemon_param_cache=str(blocker / "params")))["disk"]
    assert row.verdict is Verdict.FAIL
    assert "is not writable" in row.detail


def test_a_folder_that_cannot_be_created_fails(machine: Machine) -> None:
    blocker = machine.root / "blocker"
    blocker.write_text("")
    results = machine.check(state_dir=str(blocker / "state"))
    assert failing(results) == ["state_dir"]
    assert "Not a directory" in rows(results)["state_dir"].detail


def test_a_taken_port_fails_its_row(
    machine: Machine,
    listening: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    taken = f"127.0.0.1:{listening.getsockname()[1]}"
    rc, document = run_command(machine, monkeypatch, capsys, daemon_status_listen=taken)
    assert rc == 1
    bad = [row for row in document["checks"] if row["verdict"] == "fail"]
    assert bad == [
        {
            "name": "daemon_status_listen",
            "verdict": "fail",
            "detail": f"{taken}: in use by another process",
        }
    ]


def test_a_taken_tcp_daemon_port_fails(machine: Machine, listening: socket.socket) -> None:
    taken = f"127.0.0.1:{listening.getsockname()[1]}"
    results = machine.check(daemon_listen=taken)
    assert failing(results) == ["daemon_listen"]


def test_a_live_unix_socket_fails_the_daemon_listen_row(machine: Machine) -> None:
    path = machine.root / "run" / "cuzk.sock"
    path.parent.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()
        row = rows(machine.check())["daemon_listen"]
    assert row.verdict is Verdict.FAIL
    assert "a process answers on that socket" in row.detail


def test_two_of_our_addresses_on_one_port_fail(machine: Machine) -> None:
    status = machine.flags["daemon_status_listen"]
    results = machine.check(health_listen=status.replace("127.0.0.1", "0.0.0.0"))
    assert failing(results) == ["health_listen"]
    assert rows(results)["health_listen"].detail.endswith("is also daemon_status_listen")


def test_the_health_port_is_not_checked_when_the_server_is_off(
    machine: Machine, listening: socket.socket
) -> None:
    taken = f"127.0.0.1:{listening.getsockname()[1]}"
    row = rows(machine.check(health_listen=taken, health_enabled="false"))["health_listen"]
    assert row.verdict is Verdict.OK
    assert "health server off" in row.detail


def test_a_cgroup_too_small_for_one_worker_names_the_shortfall(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.set_cgroup_limit(64 * GIB)
    rc, document = run_command(machine, monkeypatch, capsys)
    assert rc == 1
    row = next(r for r in document["checks"] if r["name"] == "memory")
    assert row["verdict"] == "fail"
    # 64 GiB − margin 16 GiB = 48 GiB, one worker needs 69 + 20 = 89 GiB.
    assert "cgroup 64 GiB" in row["detail"]
    assert "needs 89 GiB for 1 worker" in row["detail"]
    assert "short by 41 GiB" in row["detail"]
    assert [r["name"] for r in document["checks"] if r["verdict"] == "fail"] == ["memory"]


def test_an_override_past_the_limit_warns_of_oom(machine: Machine) -> None:
    row = rows(machine.check(workers="12"))["memory"]
    assert row.verdict is Verdict.WARN
    assert "12 workers" in row.detail
    assert "OOM risk" in row.detail


def test_an_unreachable_manager_fails(
    machine: Machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_loopback_port()}"
    rc, document = run_command(machine, monkeypatch, capsys, manager_url=url)
    assert rc == 1
    row = next(r for r in document["checks"] if r["name"] == "manager")
    assert row["verdict"] == "fail"
    assert row["detail"].startswith(f"GET {url}/status failed after")
    assert "ConnectError" in row["detail"]


def test_a_manager_that_answers_is_ok_and_gets_the_token(machine: Machine) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[{"uuid": "u1", "state": "running"}])

    probes = replace(machine.probes, http_transport=httpx.MockTransport(handler))
    results = machine.check(probes, manager_url="http://manager:8080/", manager_token="s3cret")
    row = rows(results)["manager"]
    assert row.verdict is Verdict.OK
    assert row.detail.startswith("GET http://manager:8080/status: 200 in ")
    assert row.detail.endswith("(1 instances)")
    assert seen[0].headers["Authorization"] == "Bearer s3cret"
    assert doctor.overall(results) is Verdict.OK


def test_a_manager_error_status_fails(machine: Machine) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(503, json={"error": "down"}))
    probes = replace(machine.probes, http_transport=transport)
    row = rows(machine.check(probes, manager_url="http://manager:8080"))["manager"]
    assert row.verdict is Verdict.FAIL
    assert "answered 503" in row.detail
    assert "down" in row.detail


def test_a_missing_or_bad_c1_file_fails(machine: Machine) -> None:
    missing = machine.root / "nope.json"
    row = rows(machine.check(c1_file=str(missing)))["c1_file"]
    assert row.verdict is Verdict.FAIL
    assert str(missing) in row.detail
    assert "No such file" in row.detail
    bad = machine.root / "bad.json"
    bad.write_text("not json")
    assert "is not JSON" in rows(machine.check(c1_file=str(bad)))["c1_file"].detail


# --- GPUs -------------------------------------------------------------------------------------


class _BrokenNvml:
    """A pynvml stand-in whose init fails as a machine without the driver does."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        def __str__(self) -> str:
            return "NVML Shared Library Not Found"

    def nvmlInit(self) -> None:
        raise self.NVMLError_LibraryNotFound()


def test_nvml_missing_fails_and_says_what_was_wrong(machine: Machine) -> None:
    probes = replace(machine.probes, gpu_probe=lambda s: NvmlProbe(nvml=_BrokenNvml()))
    results = machine.check(probes)
    assert failing(results) == ["gpus"]
    detail = rows(results)["gpus"].detail
    assert detail.startswith("NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library")
    assert "gpu_probe=nvml" in detail
    assert rows(results)["vram"].verdict is Verdict.WARN


def test_gpu_probe_none_skips_the_gpus_as_warnings(machine: Machine) -> None:
    def never(s: Settings) -> StaticProbe:
        raise AssertionError("gpu_probe=none must not probe")

    results = machine.check(replace(machine.probes, gpu_probe=never), gpu_probe="none")
    assert rows(results)["gpus"].verdict is Verdict.WARN
    assert rows(results)["vram"].verdict is Verdict.WARN
    assert doctor.exit_code(results) == 0
    assert "no GPU seen" in rows(results)["memory"].detail


def test_gpus_too_small_for_a_proof_fail_vram_and_the_plan(machine: Machine) -> None:
    probes = replace(machine.probes, gpu_probe=lambda s: StaticProbe.uniform(2, 8))
    results = machine.check(probes)
    assert failing(results) == ["vram", "memory"]
    assert "less than the 12 GiB a proof needs" in rows(results)["vram"].detail


def test_vram_verdicts() -> None:
    def device(index: int, total_gib: float, free_gib: float) -> GpuDevice:
        total, free = int(total_gib * GIB), int(free_gib * GIB)
        return GpuDevice(index, "gpu", None, total, total - free, free)

    def judge(*devices: GpuDevice) -> CheckResult:
        return doctor.judge_vram(GpuFacts("nvml", True, devices=devices), 12.0)

    assert judge(device(0, 24, 24), device(1, 24, 23)).verdict is Verdict.OK
    mixed = judge(device(0, 24, 24), device(1, 8, 8))
    assert mixed.verdict is Verdict.WARN
    assert "GPU 1: 8 GiB" in mixed.detail
    busy = judge(device(0, 24, 4))
    assert busy.verdict is Verdict.WARN
    assert "4 GiB free of 24 GiB" in busy.detail


def test_gpu_verdicts() -> None:
    gpu = GpuDevice(0, "A40", None, 48 * GIB, 0, 48 * GIB)
    faulty = GpuFacts("nvml", True, devices=(gpu,), faults=(GpuFault(1, "GPU is lost"),))
    assert doctor.judge_gpus(faulty).verdict is Verdict.WARN
    lost = GpuFacts("nvml", True, faults=(GpuFault(0, "GPU is lost"),))
    assert doctor.judge_gpus(lost).verdict is Verdict.FAIL
    assert doctor.judge_gpus(GpuFacts("nvml", True)).detail == "nvml probe works but sees no GPU"
    sim = GpuFacts("sim", True, error="refused", source="http://127.0.0.1:9821/status")
    assert doctor.judge_gpus(sim).verdict is Verdict.WARN


def test_disk_need_is_the_constant_less_what_is_present() -> None:
    # The figure itself is core.disk's (tests/test_core_disk.py); doctor says it in words.
    assert doctor.disk_need(0).total_bytes == REQUIRED_FREE_BYTES == 125 * GIB
    words = doctor.disk_need_words(doctor.disk_need(40 * GIB))
    assert words == "needs 85 GiB: PCE files 25 GiB + parameters 60 GiB (40 GiB already present)"
    assert doctor.disk_need(500 * GIB).total_bytes == PCE_FILES_BYTES


def test_overall_and_exit_code() -> None:
    good, meh, bad = (CheckResult("x", v, "") for v in Verdict)
    assert (doctor.overall([good, meh]), doctor.exit_code([good, meh])) == (Verdict.WARN, 0)
    assert (doctor.overall([good, bad, meh]), doctor.exit_code([bad])) == (Verdict.FAIL, 1)
    assert (doctor.overall([]), doctor.exit_code([good])) == (Verdict.OK, 0)


def test_a_crashing_check_is_its_own_fail_row(machine: Machine) -> None:
    def boom(s: Settings) -> MemorySampler:
        raise RuntimeError("sampler exploded")

    results = machine.check(replace(machine.probes, memory_sampler=boom))
    assert failing(results) == ["memory"]
    assert rows(results)["memory"].detail == "check crashed: RuntimeError: sampler exploded"
    assert len(results) == 13


def test_a_port_probe_error_other_than_in_use_is_reported() -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface here: bind fails with EADDRNOTAVAIL.
    problem = doctor.listen_problem(Address(host="192.0.2.1", port=9821))
    assert problem is not None
    assert problem.startswith("cannot bind")


def test_a_unix_socket_path_too_long_for_the_kernel_fails(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 120) / "cuzk.sock"
    problem = doctor.listen_problem(Address(path=path))
    assert problem is not None
    assert "more than the 107" in problem


# --- end to end ---------------------------------------------------------------------------------


def cli(machine: Machine, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "doctor", *argv],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip


def test_cli_end_to_end_on_a_prepared_machine(machine: Machine) -> None:
    """The real sampler reads the fixture cgroup; settings come as flags and as env."""
    if shutil.disk_usage(machine.root).free < PCE_FILES_BYTES:
        pytest.skip("needs 25 GiB free under tmp_path for the disk check's PCE files")
    # The real host's RAM is too small for a real plan, so plan as the simulator does: 1 MiB
    # measured is 1 GiB planned; a 512 MiB cgroup limit is then a 512 GiB machine.
    machine.set_cgroup_limit(512 << 20)
    # Parameters already present (a sparse file): only the PCE files need room.
    with open(machine.root / "params" / "porep.params", "wb") as f:
        f.truncate(PARAMS_BYTES)
    flags = dict(machine.flags, gpu_probe="none", plan_memory_scale="1024")
    env_names = ("state_dir", "c1_file", "health_listen")
    env = {settings.ENV_PREFIX + name.upper(): flags.pop(name) for name in env_names}
    env[settings.ENV_PREFIX + "PARAMS_EXPECTED"] = f"porep.params:{PARAMS_BYTES}"
    argv = [a for name, value in flags.items() for a in ("--" + name.replace("_", "-"), value)]
    out = cli(machine, "--json", *argv, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    document = json.loads(out.stdout)
    verdicts = {row["name"]: row["verdict"] for row in document["checks"]}
    assert verdicts == {
        **dict.fromkeys(verdicts, "ok"), "gpus": "warn", "vram": "warn", "manager": "warn",
    }  # fmt: skip
    assert document["overall"] == "warn"
    assert document["exit_code"] == 0
    memory = next(row for row in document["checks"] if row["name"] == "memory")["detail"]
    assert "12 workers (warmup 2)" in memory, memory
    assert not (machine.root / "state").exists()
    assert out.stderr == ""


def test_cli_end_to_end_failure_and_bad_input(machine: Machine) -> None:
    missing = str(machine.root / "nope")
    out = cli(machine, *machine.argv(daemon_binary=missing, gpu_probe="none"), env={})
    assert out.returncode == 1
    assert "daemon_binary" in out.stdout
    assert "overall: fail (exit 1)" in out.stdout
    out = cli(machine, "--gpu-probe", "cuda", env={})
    assert out.returncode == 2
    assert "gpu_probe" in out.stderr
