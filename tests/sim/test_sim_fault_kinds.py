"""Every fault kind of docs/simulator.md, injected into the real sim process."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from simhelpers import SimProcess, free_tcp_port, poll_until, submit_request, write_config

from cuzk_supervisor.proto import proving_pb2 as pb

FAST = 2000.0
Status = pb.AwaitProofResponse.Status


def config(tmp_path: Path, workers: int = 2, **daemon: str) -> Path:
    return write_config(
        tmp_path,
        synthesis={"partition_workers": workers},
        srs={"param_cache": str(tmp_path), "preload": ["porep-32g"]},
        daemon=daemon,
    )


def faults(*specs: str) -> list[str]:
    return [arg for spec in specs for arg in ("--fault", spec)]


def test_drop_cuts_connections_and_the_job_survives(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=config(tmp_path), time_scale=500, args=faults("drop,at_partition=6"))
    stub = sim.stub()
    stub.SubmitProof(submit_request("d"), timeout=5)
    pending = stub.AwaitProof.future(pb.AwaitProofRequest(job_id="d"), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        pending.result()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # transport error, not a status
    sim.wait_for_line(r"WARN cuzk_sim::fault: dropped client connections connections=[1-9]")
    # As a client must: after a transport error, await the same job again (the channel may
    # need a moment, and a try or two, to notice the old connection is gone).
    again = poll_until(
        lambda: stub.AwaitProof(pb.AwaitProofRequest(job_id="d"), timeout=5, wait_for_ready=True),
        10,
        what="a successful re-await",
    )
    assert again.status == Status.COMPLETED
    assert 'cuzk_sim_submissions_total{request_id="d"} 1' in sim.metrics()


def test_hang_accepts_calls_and_never_answers(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(
        config=config(tmp_path, status_listen=f"127.0.0.1:{port}"),
        time_scale=FAST,
        args=faults("hang,after_proofs=1"),
    )
    stub = sim.stub()
    stub.SubmitProof(submit_request("h"), timeout=5)
    with pytest.raises(grpc.RpcError) as err:  # the proof completes in ~0.2 s; no answer
        stub.AwaitProof(pb.AwaitProofRequest(job_id="h"), timeout=0.8)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    sim.wait_for_line(r"sim fault firing fault=hang")
    with pytest.raises(grpc.RpcError) as err:
        sim.status(timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=0.3)
    assert sim.proc.poll() is None


def test_exit_with_code_after_a_proof(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path), time_scale=FAST, args=faults("exit:7,after_proofs=1")
    )
    sim.stub().SubmitProof(submit_request("e"), timeout=5)
    assert sim.wait(10) == 7


def test_faults_from_the_environment(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=FAST,
        env={"CUZK_SIM_FAULTS": "flood:1;exit:5,after_s=0.3"},
    )
    assert sim.wait(10) == 5
    sim.wait_for_line(r"sim fault firing fault=exit:5,after_s=0.3 point=timer")


def test_oom_bumps_memory_events_then_sigkills_itself(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text(
        "low 0\nhigh 0\nmax 4\noom 2\noom_kill 3\noom_group_kill 0\n"
    )
    # SRS 44 GiB + one partition 15 = 59 (fine), + a second = 74 > 60.
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=FAST,
        args=[*faults("oom:60"), "--cgroup-dir", str(cgroup)],
    )
    with contextlib.suppress(grpc.RpcError):  # it may die before the reply is on the wire
        sim.stub().SubmitProof(submit_request("o"), timeout=5)
    assert sim.wait(10) == -signal.SIGKILL
    assert (cgroup / "memory.events").read_text() == (
        "low 0\nhigh 0\nmax 4\noom 3\noom_kill 4\noom_group_kill 0\n"
    )


def test_oom_creates_memory_events_if_missing(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=FAST,
        args=faults("oom:60"),
        env={"CUZK_SIM_CGROUP_DIR": str(tmp_path)},
    )
    with contextlib.suppress(grpc.RpcError):  # it may die before the reply is on the wire
        sim.stub().SubmitProof(submit_request("o"), timeout=5)
    assert sim.wait(10) == -signal.SIGKILL
    assert (tmp_path / "memory.events").read_text() == "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n"


def test_never_ready_prints_ready_but_never_binds(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(
        listen=f"127.0.0.1:{port}",
        config=config(tmp_path),
        time_scale=FAST,
        args=faults("never-ready", "flood:1"),
        ready=False,
        env={"CUZK_SIM_BIND_DELAY_MS": "0"},
    )
    sim.wait_for_line("cuzk-daemon ready, serving on")
    # flood fires at the checkpoint that follows the bind step: the bind is behind us.
    sim.wait_for_line(r"sim fault firing fault=flood:1 point=start")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert sim.proc.poll() is None


def test_addr_in_use_fault_fails_like_a_real_bind(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(
        listen=f"127.0.0.1:{port}",
        config=config(tmp_path),
        time_scale=FAST,
        args=faults("addr-in-use"),
        ready=False,
    )
    assert sim.wait(10) == 1
    assert "Address already in use (os error 98)" in sim.stderr_text()
    with socket.socket() as probe:  # the port itself was free all along
        probe.bind(("127.0.0.1", port))


def test_fail_after_proofs_ends_a_later_proof_failed(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=FAST,
        args=faults("fail:disk full, retry later,after_proofs=1"),
    )
    stub = sim.stub()
    first = stub.Prove(pb.ProveRequest(submit=submit_request("1")), timeout=10).result
    second = stub.Prove(pb.ProveRequest(submit=submit_request("2")), timeout=10).result
    third = stub.Prove(pb.ProveRequest(submit=submit_request("3")), timeout=10).result
    assert first.status == Status.COMPLETED
    assert (second.status, second.error_message) == (Status.FAILED, "disk full, retry later")
    assert third.status == Status.COMPLETED  # times=1 by default


def test_fail_at_partition_stops_the_proof_there(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=FAST,
        args=faults("fail:boom,at_partition=3"),
        env={"RUST_LOG": "debug"},
    )
    stub = sim.stub()
    failed = stub.Prove(pb.ProveRequest(submit=submit_request("f")), timeout=10).result
    assert (failed.status, failed.error_message) == (Status.FAILED, "boom")
    assert failed.synthesis_ms == 0  # a FAILED result carries no timings, as the real one
    # The answer can arrive before the daemon's last lines about the job have been read here.
    sim.wait_for_line(r"proof failed job_id=f ")
    synthesized = {
        int(m.group(1))
        for line in sim.lines
        if "job_id=f " in line
        and (m := re.search(r"partition synthesized.* partition=(\d+)", line))
    }
    assert synthesized == {0, 1}  # partitions 2 and 3 started; 3 failed the proof at once
    assert not any("job_id=f " in ln and "partition synthesis started" in ln and "partition=5" in ln
                   for ln in sim.lines)  # fmt: skip
    after = stub.Prove(pb.ProveRequest(submit=submit_request("g")), timeout=10).result
    assert after.status == Status.COMPLETED  # its slots were freed


def _flood_stats(path: Path) -> tuple[int, float] | None:
    """(lines, seconds) between the first and last flood batch written so far."""
    stamps = re.findall(r"^\S*?(\d{4}-\S+Z)\S* .*sim log flood", path.read_text(), re.M)
    if len(stamps) < 60_000:
        return None
    first, last = (
        dt.datetime.fromisoformat(s.replace("Z", "+00:00")) for s in (stamps[0], stamps[-1])
    )
    return len(stamps), (last - first).total_seconds()


@pytest.mark.slow
def test_flood_really_writes_fifty_thousand_lines_a_second(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    out = tmp_path / "stdout.log"
    sim = sim_factory(
        config=config(tmp_path), time_scale=FAST, stdout_path=out, args=faults("flood:50000")
    )
    lines, seconds = poll_until(lambda: _flood_stats(out), 15, interval=0.2, what="60k flood lines")
    assert lines / seconds == pytest.approx(50_000, rel=0.1)
    assert sim.status().uptime_seconds > 0  # still serving while flooding


def test_ignore_sigterm_needs_sigkill(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=config(tmp_path), time_scale=FAST, args=faults("ignore-sigterm"))
    sim.wait_for_line("sim fault firing fault=ignore-sigterm")
    sim.send(signal.SIGTERM)
    assert sim.status().uptime_seconds >= 0  # answered after SIGTERM: it survived it
    assert sim.proc.poll() is None
    sim.send(signal.SIGKILL)
    assert sim.wait(10) == -signal.SIGKILL


def test_fork_grandchild_leaves_a_detached_process_and_exits_1(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(
        config=config(tmp_path), time_scale=FAST, ready=False, args=faults("fork-grandchild:60")
    )
    assert sim.wait(15) == 1
    line = sim.wait_for_line(r"forked a grandchild, exiting pid=(\d+)")
    pid = int(re.search(r"pid=(\d+)", line).group(1))  # type: ignore[union-attr]
    try:
        assert os.getsid(pid) not in (os.getsid(0), sim.proc.pid)  # its own session
        assert sim._reader_alive()  # it still holds the daemon's stdout open
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    poll_until(lambda: not sim._reader_alive(), 10, what="stdout EOF once the grandchild died")
