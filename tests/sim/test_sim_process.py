"""The sim as a process: start-up order, signals, sockets, logs, both releases."""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from pacehelpers import scaled
from simhelpers import SimProcess, free_tcp_port, poll_until, submit_request, write_config

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.daemon.residency import pce_cache_path

FAST = 2000.0
READY = r"cuzk-daemon ready, serving on "
Status = pb.AwaitProofResponse.Status


def workers_config(tmp_path: Path, workers: int = 2, **extra: dict) -> Path:
    return write_config(
        tmp_path,
        synthesis={"partition_workers": workers},
        srs={"param_cache": str(tmp_path), "preload": ["porep-32g"]},
        **extra,
    )


def test_ready_line_comes_before_the_port_is_bound(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(
        listen=f"127.0.0.1:{port}",
        config=workers_config(tmp_path),
        time_scale=FAST,
        env={"CUZK_SIM_BIND_DELAY_MS": "800"},  # widen the real 75 ms gap for the test
        ready=False,
    )
    sim.wait_for_line(READY)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    sim.wait_ready(10)  # ...and it does bind a little later


def test_sigint_stops_the_workers_but_not_the_server(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    # One worker: the first proof takes 10 x 29 s x 1.75 + 47 s = 554 s, 2.8 s at scale 200
    # (longer on a slow machine): seen running before it ends, however loaded the machine (at
    # 1.1 s a loaded machine's first look came after the end).
    scale = scaled(200)
    sim = sim_factory(config=workers_config(tmp_path, workers=1), time_scale=scale)
    stub = sim.stub()
    stub.SubmitProof(submit_request("stuck"), timeout=5)
    poll_until(lambda: sim.status().queues[0].in_progress == 1, 5, what="proof running")
    sim.send(signal.SIGINT)
    sim.wait_for_line("stopping engine workers")
    with pytest.raises(grpc.RpcError) as err:  # it would have finished by now
        stub.AwaitProof(pb.AwaitProofRequest(job_id="stuck"), timeout=554 / scale + 0.5)
    # Cut at its deadline, by the client's own timer or by the server's (tonic's CANCELLED).
    assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
    assert sim.proc.poll() is None
    assert sim.status().total_proofs_completed == 0  # the gRPC server still answers
    sim.send(signal.SIGINT)  # a second one changes nothing
    assert sim.status().queues[0].in_progress == 1


def test_sigterm_is_not_handled_and_kills_at_once(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=workers_config(tmp_path), time_scale=FAST)
    sim.stub().SubmitProof(submit_request("t"), timeout=5)
    sim.send(signal.SIGTERM)
    assert sim.wait(10) == -signal.SIGTERM


def test_address_in_use_is_an_error_line_and_exit_1(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        sim = sim_factory(
            listen=f"127.0.0.1:{port}",
            config=workers_config(tmp_path),
            time_scale=FAST,
            ready=False,
        )
        assert sim.wait(20) == 1
    assert "Address already in use" in sim.stderr_text()
    assert re.search(r"ERROR cuzk_daemon: transport error", "\n".join(sim.lines))


def test_unix_socket_stale_file_removed_at_start_not_at_exit(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    path = tmp_path / "cuzk.sock"
    with socket.socket(socket.AF_UNIX) as stale:  # a socket file nobody listens on
        stale.bind(str(path))
    sim = sim_factory(listen=f"unix://{path}", config=workers_config(tmp_path), time_scale=FAST)
    reply = sim.stub().Prove(pb.ProveRequest(submit=submit_request("u")), timeout=10)
    assert reply.result.status == Status.COMPLETED
    sim.send(signal.SIGTERM)
    sim.wait(10)
    assert path.exists()


def test_stdout_is_coloured_even_redirected_with_no_color(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=workers_config(tmp_path), time_scale=FAST, env={"NO_COLOR": "1"})
    ready = next(line for line in sim.raw_lines if "cuzk-daemon ready" in line)
    assert "\x1b[" in ready
    stripped = sim.wait_for_line(READY)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z  INFO cuzk_daemon: "
        r"cuzk-daemon ready, serving on 127\.0\.0\.1:\d+",
        stripped,
    )
    for line in (
        "cuzk-daemon starting",
        "cuzk engine started",
        "loading SRS from disk",
        r"SRS loaded successfully .*elapsed_ms=45000",
    ):
        sim.wait_for_line(line)


def test_rust_log_overrides_flag_and_config(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    config = workers_config(tmp_path, logging={"level": "debug"})
    sim = sim_factory(
        config=config, time_scale=FAST, args=["--log-level", "debug"], env={"RUST_LOG": "warn"}
    )
    sim.stub().SubmitProof(submit_request("bad", payload=b"junk"), timeout=5)
    sim.wait_for_line("ERROR cuzk_core::engine: proof failed")
    assert not [line for line in sim.lines if " INFO " in line or "DEBUG" in line]


def test_config_level_debug_shows_partition_progress(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=workers_config(tmp_path, logging={"level": "debug"}), time_scale=FAST)
    sim.stub().Prove(pb.ProveRequest(submit=submit_request("d")), timeout=10)
    sim.wait_for_line(r"DEBUG cuzk_core::pipeline: partition synthesis started .*partition=9")
    sim.wait_for_line("PoRep proof self-check PASSED")


def test_missing_config_file_silently_means_defaults(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=tmp_path / "absent.toml", time_scale=FAST)
    sim.wait_for_line(r"cuzk engine started .*synthesis_slots=20")
    assert not [line for line in sim.lines if " WARN " in line or "ERROR" in line]
    assert "cuzk_sim_steady_state_proofs_per_hour 84.706" in sim.metrics()


def test_bad_config_is_an_error_exit(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[synthesis]\npartition_workers = 'many'\n")
    sim = sim_factory(config=bad, ready=False)
    assert sim.wait(20) == 1
    assert "partition_workers" in sim.stderr_text()


def test_bad_fault_switch_is_an_error_exit(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=workers_config(tmp_path), args=["--fault", "explode"], ready=False)
    assert sim.wait(20) == 1
    assert "unknown fault kind 'explode'" in sim.stderr_text()


def test_first_proof_after_every_start_is_slower(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    pce_cache_path(tmp_path).write_text("{}")  # PCE already built: only the 1.25 remains
    sim = sim_factory(config=workers_config(tmp_path), time_scale=FAST)
    sim.wait_for_line("PCE loaded from disk")
    stub = sim.stub()
    first = stub.Prove(pb.ProveRequest(submit=submit_request("1")), timeout=10).result
    second = stub.Prove(pb.ProveRequest(submit=submit_request("2")), timeout=10).result
    assert first.synthesis_ms == 380_000  # 10 partitions x 30.4 s x 1.25
    assert second.synthesis_ms == 304_000
    # The GPU stage of each pair of partitions: both prepared (0.5 s), proved in turn on the one
    # GPU (3 s each), finalized (0.5 s): 4 s and 7 s, five pairs. pipeline.rs's gpu_duration runs
    # from gpu_prove_start's entry to the finalizer's end, the wait for the GPU included.
    assert first.gpu_compute_ms == second.gpu_compute_ms == 55_000


def test_workers_release_builds_the_pce_once_and_reloads_it(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    config = workers_config(tmp_path)
    sim = sim_factory(config=config, time_scale=FAST)
    first = sim.stub().Prove(pb.ProveRequest(submit=submit_request("w")), timeout=10).result
    assert first.synthesis_ms == 532_000  # 304 s x 1.4 (no PCE) x 1.25 (first after start)
    for line in (
        "background PCE extraction starting",
        "background PCE extraction complete",
        "PCE saved to disk",
    ):
        sim.wait_for_line(line)
    assert pce_cache_path(tmp_path).exists()
    sim.kill()
    again = sim_factory(config=config, time_scale=FAST)
    lines = again.lines
    ready_at = next(i for i, ln in enumerate(lines) if "cuzk-daemon ready" in ln)
    assert any("PCE loaded from disk" in ln for ln in lines[:ready_at])  # before the port
    reply = again.stub().Prove(pb.ProveRequest(submit=submit_request("w2")), timeout=10).result
    assert reply.synthesis_ms == 380_000


def test_budget_release_pays_srs_and_pce_on_the_first_proof_every_start(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    config = write_config(
        tmp_path,
        memory={"total_budget": "256G"},  # unparsable: silently 50 GiB -> 1 partition at once
        srs={"param_cache": str(tmp_path), "preload": ["porep-32g"]},  # ignored by budget
    )
    for _ in range(2):
        sim = sim_factory(config=config, time_scale=FAST, args=["--release", "budget"])
        lines = sim.lines
        assert not [ln for ln in lines if "loading SRS" in ln or "PCE" in ln]
        assert re.search(r"synthesis_slots=1\b", "\n".join(lines))
        assert sim.status().pinned_memory_limit_bytes == 0  # never filled in by the real one
        reply = sim.stub().Prove(pb.ProveRequest(submit=submit_request("b")), timeout=20)
        assert reply.result.status == Status.COMPLETED
        sim.wait_for_line("loading SRS from disk")
        sim.wait_for_line("background PCE extraction complete")
        sim.wait_for_line("PCE saved to disk")
        sim.kill()
