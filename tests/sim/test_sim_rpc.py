"""The eight RPCs against the real sim process, with the real server's quirks."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from pacehelpers import scaled
from simhelpers import SimProcess, free_tcp_port, poll_until, submit_request, write_config

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.daemon.c1 import make_c1

FAST = 2000.0  # simulated seconds per real second: a proof in ~0.1 s
Status = pb.AwaitProofResponse.Status


def porep_config(tmp_path: Path, workers: int = 2, status_port: int | None = None) -> Path:
    daemon = {"status_listen": f"127.0.0.1:{status_port}"} if status_port else {}
    return write_config(
        tmp_path,
        synthesis={"partition_workers": workers},
        srs={"param_cache": str(tmp_path), "preload": ["porep-32g"]},
        daemon=daemon,
    )


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """One sim shared by the tests that look only at their own request ids (saves a start
    per test); tests needing fresh counters or other settings start their own."""
    tmp = tmp_path_factory.mktemp("shared-sim")
    shared = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}", config=porep_config(tmp), time_scale=FAST
    )
    yield shared
    shared.kill()


def test_submit_returns_at_once_with_request_id_as_job_id(sim: SimProcess) -> None:
    reply = sim.stub().SubmitProof(submit_request("job-1"), timeout=5)
    assert reply.job_id == "job-1"
    empty = sim.stub().SubmitProof(submit_request(""), timeout=5)
    assert uuid.UUID(empty.job_id).version == 4


def test_await_ignores_timeout_ms_and_blocks_until_done(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=porep_config(tmp_path), time_scale=600)  # first proof ~0.5 s
    stub = sim.stub()
    stub.SubmitProof(submit_request("slow"), timeout=5)
    start = time.monotonic()
    result = stub.AwaitProof(pb.AwaitProofRequest(job_id="slow", timeout_ms=1), timeout=30)
    # Not a margin: a lower bound (it held the call far past 1 ms); slow only adds to it.
    assert time.monotonic() - start > 0.25
    assert result.status == Status.COMPLETED  # never TIMEOUT
    assert len(result.proof) == 1920


def test_same_request_id_is_proved_twice(sim: SimProcess) -> None:
    stub = sim.stub()
    stub.SubmitProof(submit_request("dup"), timeout=5)
    stub.SubmitProof(submit_request("dup"), timeout=5)
    assert 'cuzk_sim_submissions_total{request_id="dup"} 2' in sim.metrics()

    def proved() -> int:
        return sum("proof completed job_id=dup " in line for line in sim.lines)

    poll_until(lambda: proved() == 2, 10, what="both proved")


def test_a_finished_id_gets_its_stored_result_at_once_and_a_later_job_overwrites_it(
    sim: SimProcess,
) -> None:
    stub = sim.stub()
    stub.SubmitProof(submit_request("x", payload=b"not json"), timeout=5)
    first = stub.AwaitProof(pb.AwaitProofRequest(job_id="x"), timeout=5)
    assert first.status == Status.FAILED
    # AwaitProof and Prove look in the finished results first: no new proof.
    assert stub.AwaitProof(pb.AwaitProofRequest(job_id="x"), timeout=5) == first
    proved = stub.Prove(pb.ProveRequest(submit=submit_request("x")), timeout=5)
    assert proved.result == first
    assert 'cuzk_sim_submissions_total{request_id="x"} 1' in sim.metrics()  # Prove added none
    # SubmitProof with the same id enqueues a new job (no de-duplication); its result, when it
    # ends, overwrites the stored one (docs/daemon.md, "Transport behaviour").
    stub.SubmitProof(submit_request("x"), timeout=5)
    sim.wait_for_line(r"proof completed job_id=x ")
    later = stub.AwaitProof(pb.AwaitProofRequest(job_id="x"), timeout=5)
    assert later.status == Status.COMPLETED
    assert 'cuzk_sim_submissions_total{request_id="x"} 2' in sim.metrics()


def test_prove_with_a_running_id_proves_again_and_the_first_to_finish_answers(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    """The real engine (docs/daemon.md): a Prove under an id still running enqueues a second
    job; every caller waiting under the id gets the first to finish; the second overwrites the
    stored result. (The simulator used to answer it from the running job: kinder than the field.)"""
    # The first proof ~3 s (longer on a slow machine): still running when the Prove arrives, an
    # ordering arranged (at ~0.5 s a loaded machine's Prove came after it had finished).
    sim = sim_factory(config=porep_config(tmp_path), time_scale=scaled(100))
    stub = sim.stub()
    stub.SubmitProof(submit_request("running"), timeout=5)
    proved = stub.Prove(pb.ProveRequest(submit=submit_request("running")), timeout=30)
    assert proved.result.status == Status.COMPLETED
    assert 'cuzk_sim_submissions_total{request_id="running"} 2' in sim.metrics()

    def completions() -> int:
        return sum("proof completed job_id=running " in line for line in sim.lines)

    poll_until(lambda: completions() == 2, 30, what="the second job proved")
    stored = stub.AwaitProof(pb.AwaitProofRequest(job_id="running"), timeout=5)
    assert stored.status == Status.COMPLETED
    assert stored.proof != proved.result.proof  # the second proof, not the first


def test_a_failed_result_has_all_timings_zero(sim: SimProcess) -> None:
    reply = sim.stub().Prove(
        pb.ProveRequest(submit=submit_request("zero", payload=b"junk")), timeout=5
    )
    result = reply.result
    assert result.status == Status.FAILED
    timings = (result.queue_wait_ms, result.srs_load_ms, result.synthesis_ms,
               result.gpu_compute_ms, result.total_ms)  # fmt: skip
    assert timings == (0, 0, 0, 0, 0)


def test_unknown_job_is_not_found(sim: SimProcess) -> None:
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().AwaitProof(pb.AwaitProofRequest(job_id="never-submitted"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_results_are_kept_and_returned_at_once(sim: SimProcess) -> None:
    stub = sim.stub()
    stub.SubmitProof(submit_request("kept"), timeout=5)
    first = stub.AwaitProof(pb.AwaitProofRequest(job_id="kept"), timeout=10)
    again = stub.AwaitProof(pb.AwaitProofRequest(job_id="kept"), timeout=1)
    assert again == first
    assert first.status == Status.COMPLETED


def test_bad_c1_is_a_failed_proof_not_an_rpc_error(sim: SimProcess) -> None:
    stub = sim.stub()
    failed_before = sim.status().total_proofs_failed
    stub.SubmitProof(submit_request("bad", payload=b'{"SectorNum": 1}'), timeout=5)
    result = stub.AwaitProof(pb.AwaitProofRequest(job_id="bad"), timeout=5)
    assert result.status == Status.FAILED
    assert result.error_message.startswith(
        "C1 parse failed: failed to parse C1 output wrapper JSON"
    )
    proved = stub.Prove(pb.ProveRequest(submit=submit_request("bad2", payload=b"junk")), timeout=5)
    assert proved.result.status == Status.FAILED
    assert proved.result.error_message.startswith(
        "C1 parse failed: failed to parse C1 output wrapper JSON"
    )
    assert sim.status().total_proofs_failed == failed_before + 2


@pytest.mark.parametrize("kind", [pb.PROOF_KIND_UNSPECIFIED, 99])
def test_bad_proof_kind_is_invalid_argument(sim: SimProcess, kind: int) -> None:
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().SubmitProof(submit_request("k", kind=kind, payload=b""), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().Prove(pb.ProveRequest(submit=submit_request("k", kind=kind)), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_prove_without_submit_is_invalid_argument(sim: SimProcess) -> None:
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().Prove(pb.ProveRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "missing submit field"


def test_prove_is_submit_and_await_in_one_call(sim: SimProcess) -> None:
    reply = sim.stub().Prove(pb.ProveRequest(submit=submit_request("p")), timeout=10)
    assert reply.result.status == Status.COMPLETED
    assert reply.result.job_id == "p"
    assert 'cuzk_sim_submissions_total{request_id="p"} 1' in sim.metrics()


def test_cancel_and_evict_are_not_implemented(sim: SimProcess) -> None:
    stub = sim.stub()
    stub.SubmitProof(submit_request("c"), timeout=5)
    assert not stub.CancelProof(pb.CancelProofRequest(job_id="c"), timeout=5).was_running
    evicted = stub.EvictSRS(pb.EvictSrsRequest(circuit_id="porep-32g"), timeout=5)
    assert (evicted.was_loaded, evicted.freed_bytes) == (False, 0)
    assert stub.AwaitProof(pb.AwaitProofRequest(job_id="c"), timeout=10).status == Status.COMPLETED


def test_preload_srs_blocks_and_unknown_is_internal(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    sim = sim_factory(config=porep_config(tmp_path), time_scale=200)
    stub = sim.stub()
    start = time.monotonic()
    loaded = stub.PreloadSRS(pb.PreloadSrsRequest(circuit_id="wpost-32g"), timeout=10)
    # Not a margin: a lower bound (~58 simulated seconds at scale 200); slow only adds to it.
    assert time.monotonic() - start > 0.2
    assert not loaded.already_loaded
    assert loaded.load_time_ms > 45_000
    again = stub.PreloadSRS(pb.PreloadSrsRequest(circuit_id="wpost-32g"), timeout=5)
    assert again.already_loaded
    with pytest.raises(grpc.RpcError) as err:
        stub.PreloadSRS(pb.PreloadSrsRequest(circuit_id="porep-128g"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "unknown circuit ID: porep-128g"


def test_get_status_fields(tmp_path: Path, sim_factory: Callable[..., SimProcess]) -> None:
    # ~1.5 s a proof (longer on a slow machine): both still queued or running when looked at.
    sim = sim_factory(config=porep_config(tmp_path), time_scale=scaled(200), args=["--gpus", "2"])
    status = sim.status()
    assert len(status.gpus) == 4  # one per GPU worker: 2 GPUs x 2 workers
    assert sorted({g.ordinal for g in status.gpus}) == [0, 1]
    assert [s.circuit_id for s in status.loaded_srs] == ["porep-32g"]
    # As the real service: no sizes, no ref counts, no pinned figures, no queues when idle.
    assert [(s.size_bytes, s.ref_count) for s in status.loaded_srs] == [(0, 0)]
    assert (status.pinned_memory_bytes, status.pinned_memory_limit_bytes) == (0, 0)
    assert list(status.queues) == []
    stub = sim.stub()
    stub.SubmitProof(submit_request("s1"), timeout=5)  # ~1.5 s each at scale 200
    stub.SubmitProof(submit_request("s2"), timeout=5)
    busy = sim.status()
    assert [q.proof_kind for q in busy.queues] == ["porep-c2"]  # only the kind with jobs
    assert busy.queues[0].pending + busy.queues[0].in_progress == 2
    assert stub.AwaitProof(pb.AwaitProofRequest(job_id="s2"), timeout=30).status == 1
    after = sim.status()
    assert after.total_proofs_completed == 2
    assert after.uptime_seconds > 0
    assert list(after.queues) == []


def test_other_kinds_are_one_short_step(sim: SimProcess) -> None:
    for kind, size in [(pb.WINNING_POST, 192), (pb.WINDOW_POST_PARTITION, 192)]:
        reply = sim.stub().Prove(pb.ProveRequest(submit=submit_request("", kind=kind)), timeout=10)
        assert reply.result.status == Status.COMPLETED
        assert len(reply.result.proof) == size
    circuits = {s.circuit_id for s in sim.status().loaded_srs}
    assert {"winning-32g", "wpost-32g"} <= circuits


def test_metrics_text(tmp_path: Path, sim_factory: Callable[..., SimProcess]) -> None:
    sim = sim_factory(config=porep_config(tmp_path), time_scale=FAST)
    sim.stub().Prove(pb.ProveRequest(submit=submit_request("m")), timeout=10)
    sim.stub().Prove(pb.ProveRequest(submit=submit_request("m2", payload=b"junk")), timeout=10)
    text = sim.metrics()
    for name in [
        'cuzk_proofs_completed{proof_kind="porep_c2"} 1',
        'cuzk_proofs_failed{proof_kind="porep_c2"} 1',
        'cuzk_proofs_completed{proof_kind="winning_post"} 0',
        'cuzk_proof_duration_seconds_count{proof_kind="porep_c2"} 2',
        'cuzk_proof_duration_seconds_sum{proof_kind="porep_c2"} ',
        "cuzk_proofs_completed_total 1",
        "cuzk_proofs_failed_total 1",
        "cuzk_uptime_seconds ",
        "cuzk_queue_depth 0",
        "cuzk_running_jobs 0",
        "cuzk_gpu_workers 2",
        'cuzk_sim_submissions_total{request_id="m"} 1',
        "cuzk_sim_steady_state_proofs_per_hour 23.684",
    ]:
        assert name in text
    # Every series that is not the real daemon's is under cuzk_sim_.
    real = ("cuzk_proofs_completed", "cuzk_proofs_failed", "cuzk_uptime_seconds",
            "cuzk_queue_depth", "cuzk_running_jobs", "cuzk_gpu_workers",
            "cuzk_proof_duration_seconds")  # fmt: skip
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line[:1] != "#"}
    assert {n for n in names if not n.startswith("cuzk_sim_")} <= {
        *real, "cuzk_proofs_completed_total", "cuzk_proofs_failed_total",
        "cuzk_proof_duration_seconds_count", "cuzk_proof_duration_seconds_sum",
    }  # fmt: skip


@pytest.mark.slow
def test_a_60_mb_input_is_accepted(sim: SimProcess) -> None:
    payload = make_c1(60_000_000)
    stub = sim.stub()
    stub.SubmitProof(submit_request("big", payload=payload), timeout=30)
    result = stub.AwaitProof(pb.AwaitProofRequest(job_id="big"), timeout=30)
    assert result.status == Status.COMPLETED, result.error_message


def test_status_http(tmp_path: Path, sim_factory: Callable[..., SimProcess]) -> None:
    port = free_tcp_port()
    sim = sim_factory(config=porep_config(tmp_path, status_port=port), time_scale=200)
    sim.stub().SubmitProof(submit_request("h"), timeout=5)  # ~1.5 s: still live below
    sim.stub().SubmitProof(submit_request("h"), timeout=5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as reply:
        doc = json.load(reply)
    assert set(doc) >= {
        "uptime_secs",
        "memory",
        "synthesis",
        "pipelines",
        "gpu_workers",
        "counters",
        "sim",
    }
    assert set(doc["memory"]) == {"total_bytes", "used_bytes", "available_bytes"}
    assert doc["synthesis"]["max_concurrent"] == 2
    assert set(doc["counters"]) >= {"total_completed", "total_failed", "queue_depth"}
    assert doc["sim"]["submissions"] == {"h": 2}
    assert doc["sim"]["release"] == "workers"
    assert doc["sim"]["time_scale"] == 200
    assert doc["sim"]["steady_state_proofs_per_hour"] == pytest.approx(23.684, abs=1e-3)
    assert doc["sim"]["gpus"][0]["vram_total_bytes"] == 24 << 30
    assert doc["sim"]["rss_simulated_bytes"] >= 44 << 30
    live = doc["pipelines"]
    assert live
    assert {p["index"] for p in live[0]["partitions"]} == set(range(10))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    assert err.value.code == 404
