"""The simulated manager as a process: start-up, signals, state across restarts, the periodic
timeout check, the destroy hook."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from managerhelpers import ManagerFactory, ManagerProcess, poll_until, run_manager


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


def test_prints_one_ready_line_with_its_url(start: ManagerFactory) -> None:
    mgr = start()
    assert mgr.lines[0] == f"sim-manager listening on {mgr.url}"
    assert mgr.url.startswith("http://127.0.0.1:")
    assert mgr.port > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_exits_cleanly_on_signal(start: ManagerFactory, sig: int) -> None:
    mgr = start()
    mgr.register("C.1")
    assert mgr.stop(sig) == 0
    assert mgr.lines[-1] == "sim-manager stopped"
    assert "Traceback" not in mgr.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(mgr.url + "/status", timeout=2)


def test_state_and_runner_id_counter_survive_a_restart(start: ManagerFactory) -> None:
    mgr = start()
    first = mgr.register("C.1")
    second = mgr.register("C.2")
    mgr.post("/param-done", json={"uuid": first["uuid"]})
    mgr.kill_instance(second["uuid"])
    before = mgr.status()

    mgr = start.restart(mgr)
    assert mgr.status() == before
    assert mgr.register("C.1") == first  # still live: same uuid and runner id
    third = mgr.register("C.2")  # killed before the restart: a new one
    assert third["runner_id"] == second["runner_id"] + 1
    assert mgr.state()["runner_id_counter"] == third["runner_id"]


def test_runner_ids_never_repeat_across_restarts(start: ManagerFactory) -> None:
    mgr = start()
    ids = [mgr.register(f"C.{n}")["runner_id"] for n in range(3)]
    for round_ in range(2):
        mgr = start.restart(mgr)
        ids += [mgr.register(f"C.r{round_}.{n}")["runner_id"] for n in range(2)]
    assert ids == list(range(ids[0], ids[0] + 7))


def test_logs_are_memory_only(start: ManagerFactory) -> None:
    mgr = start()
    reg = mgr.register("C.1")
    mgr.post("/api/log-push", content=b"hello", headers={"X-Instance-UUID": reg["uuid"]})
    assert len(mgr.get(f"/api/instance-logs/{reg['uuid']}").json()) == 1
    mgr = start.restart(mgr)
    assert mgr.get(f"/api/instance-logs/{reg['uuid']}").json() == []


def test_refuses_a_public_address_without_allow_public(tmp_path: Path) -> None:
    result = run_manager("--db", str(tmp_path / "m.db"), "--listen", "0.0.0.0:0")
    assert result.returncode == 2
    assert "not loopback" in result.stderr
    assert "--allow-public" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--listen", "nohost"],
        ["--listen", "example.com:80"],
        ["--listen", "127.0.0.1:70000"],
    ],
)
def test_bad_listen_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    result = run_manager("--db", str(tmp_path / "m.db"), *args)
    assert result.returncode == 2
    assert "--listen" in result.stderr


def test_bad_fault_environment_is_a_usage_error(tmp_path: Path) -> None:
    env = {"CUZK_SIM_MANAGER_FAULTS": "fail_rate=2"}
    result = run_manager("--db", str(tmp_path / "m.db"), "--listen", "127.0.0.1:0", env=env)
    assert result.returncode == 2
    assert "fail_rate" in result.stderr


def test_port_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_manager("--db", str(tmp_path / "m.db"), "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "cannot bind" in result.stderr


def test_localhost_counts_as_loopback(start: ManagerFactory) -> None:
    mgr = start(listen="localhost:0")
    assert mgr.url.startswith("http://127.0.0.1:")


def test_ipv6_loopback(start: ManagerFactory) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here: {exc}")
    mgr = start(listen="[::1]:0")
    assert mgr.url.startswith("http://[::1]:")
    assert mgr.register("C.6")["runner_id"] == 1


def _state(mgr: ManagerProcess, uuid: str) -> str:
    inst = mgr.instance(uuid)
    assert inst is not None
    return str(inst["state"])


def test_param_and_bench_timeouts(start: ManagerFactory) -> None:
    mgr = start(
        "--param-timeout", "0.4", "--bench-timeout", "0.4",
        "--check-interval", "0.05", "--first-check", "0.05",
    )  # fmt: skip
    stuck = mgr.register("C.params-stuck")
    benching = mgr.register("C.bench-stuck")
    mgr.post("/param-done", json={"uuid": benching["uuid"]})
    passed = mgr.register("C.passed")
    mgr.post("/bench-done", json={"uuid": passed["uuid"], "rate": 60})
    running = mgr.register("C.running")
    mgr.post("/running", json={"uuid": running["uuid"]})

    poll_until(lambda: _state(mgr, stuck["uuid"]) == "killed", 10, what="param timeout")
    poll_until(lambda: _state(mgr, benching["uuid"]) == "killed", 10, what="bench timeout")
    assert mgr.instance(stuck["uuid"])["kill_reason"] == "param fetch timeout (90min)"  # type: ignore[index]
    assert mgr.instance(benching["uuid"])["kill_reason"] == "benchmark timeout (45min)"  # type: ignore[index]
    # no timeout after bench_done, none in running: wait for further checks to have run
    late = mgr.register("C.late")
    poll_until(lambda: _state(mgr, late["uuid"]) == "killed", 10, what="a later check")
    assert _state(mgr, passed["uuid"]) == "bench_done"
    assert _state(mgr, running["uuid"]) == "running"
    kills = {k["uuid"]: k for k in mgr.state()["kills"]}
    assert set(kills) == {stuck["uuid"], benching["uuid"], late["uuid"]}
    assert all(k["cause"] == "timeout" for k in kills.values())


def test_param_timeout_measured_from_registration_not_from_start(
    start: ManagerFactory,
) -> None:
    mgr = start("--param-timeout", "0.5", "--check-interval", "0.05", "--first-check", "0.05")
    reg = mgr.register("C.1")
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    late = mgr.register("C.2")
    poll_until(lambda: _state(mgr, late["uuid"]) == "killed", 10, what="param timeout")
    assert _state(mgr, reg["uuid"]) == "params_done"  # bench timeout is the default 45 min


def test_timeouts_continue_across_a_restart(start: ManagerFactory) -> None:
    mgr = start("--param-timeout", "1h", "--check-interval", "0.05", "--first-check", "0.05")
    reg = mgr.register("C.1")
    mgr = start.restart(
        mgr, "--param-timeout", "0.2", "--check-interval", "0.05", "--first-check", "0.05"
    )
    poll_until(lambda: _state(mgr, reg["uuid"]) == "killed", 10, what="param timeout")
    assert mgr.instance(reg["uuid"])["kill_reason"] == "param fetch timeout (90min)"  # type: ignore[index]


def test_destroy_command_runs_when_a_bench_fails(start: ManagerFactory, tmp_path: Path) -> None:
    marker = tmp_path / "destroyed"
    command = (
        f'printf "%s %s %s" "$CUZK_SIM_LABEL" "$CUZK_SIM_RUNNER_ID" "$CUZK_SIM_UUID" > {marker}'
    )
    mgr = start("--destroy-command", command)
    reg = mgr.register("C.77", min_rate=50)
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 10}).json()["passed"] is False
    text = poll_until(lambda: marker.exists() and marker.read_text(), 10, what="destroy command")
    assert text == f"C.77 {reg['runner_id']} {reg['uuid']}"
