"""The simulated daemon's ``GET /status`` in the real daemon's shape (``docs/daemon.md``,
"Optional HTTP status listener"), and the switches that make it GPU- or synthesis-bound."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simhelpers import SimProcess, free_tcp_port, poll_until, submit_request, write_config

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.daemon import model

STATES = {"pending", "synthesizing", "synth_done", "gpu", "done", "failed"}


GIB = 1 << 30
FIXTURE = Path(__file__).parent.parent / "fixtures" / "daemon_status" / "gpu_bound_8gpu.json"


def keys(value: Any) -> Any:
    """The nested key structure of a JSON value (a list by its first item)."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items() if k not in ("completed_by_kind",)}
    if isinstance(value, list):
        return [keys(value[0])] if value else []
    return type(value).__name__ if value is not None else "null"


def config(tmp_path: Path, port: int, workers: int = 2) -> Path:
    """As the supervisor renders it: the partition workers, a budget of 70 + 14 W GiB."""
    return write_config(
        tmp_path,
        synthesis={"partition_workers": workers},
        memory={"total_budget": f"{70 + 14 * workers}GiB"},
        srs={"param_cache": str(tmp_path), "preload": ["porep-32g"]},
        daemon={"status_listen": f"127.0.0.1:{port}"},
    )


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as reply:
        document: dict[str, Any] = json.load(reply)
    return document


def test_status_has_the_real_daemons_shape(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(config=config(tmp_path, port), time_scale=400, args=["--gpu-factor", "20"])
    stub = sim.stub()
    stub.SubmitProof(submit_request("a"), timeout=5)
    stub.SubmitProof(submit_request("b"), timeout=5)

    def some_partition_proving() -> dict[str, Any] | None:
        doc = status(port)
        proving = [w for w in doc["gpu_workers"] if w["state"] == "proving"]
        return doc if proving else None

    doc = poll_until(some_partition_proving, 20, what="a GPU worker proving")
    # The same shape as the documents written from status.rs's structs (tests/fixtures).
    real = json.loads(FIXTURE.read_text())["documents"][0]
    ours = {k: v for k, v in doc.items() if k != "sim"}
    assert list(ours) == list(real)
    for key in ("synthesis", "memory", "counters", "buffers"):
        assert keys(ours[key]) == keys(real[key]), key
    assert list(ours["pipelines"][0]) == list(real["pipelines"][0])
    assert list(ours["pipelines"][0]["partitions"][0]) == list(
        real["pipelines"][0]["partitions"][0]
    )
    assert list(ours["gpu_workers"][0]) == list(real["gpu_workers"][0])
    assert set(doc) == {"uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers",
                        "counters", "allocations", "buffers", "sim"}  # fmt: skip
    assert isinstance(doc["uptime_secs"], float)
    # status.rs: the budget's total over 9 GiB (98 GiB at 2 workers), not the partition limiter.
    assert doc["synthesis"] == {"max_concurrent": 10, "active": doc["synthesis"]["active"]}
    assert 0 <= doc["synthesis"]["active"] <= 2
    memory = doc["memory"]
    assert memory["total_bytes"] == 98 * GIB
    # The workers release does not gate on the budget: its reservations can pass the total.
    assert memory["available_bytes"] == max(0, 98 * GIB - memory["used_bytes"])
    (a, b) = doc["pipelines"]
    assert (a["job_id"], b["job_id"]) == ("a", "b")
    for pipeline in doc["pipelines"]:
        assert list(pipeline) == ["job_id", "proof_kind", "started_secs_ago", "total_partitions",
                                  "partitions_done", "partitions"]  # fmt: skip
        assert pipeline["proof_kind"] == "porep-c2"
        assert pipeline["total_partitions"] == model.PARTITIONS_PER_POREP
        assert pipeline["started_secs_ago"] >= 0
        parts = pipeline["partitions"]
        assert [p["index"] for p in parts] == list(range(10))
        assert {p["state"] for p in parts} <= STATES
        assert pipeline["partitions_done"] == sum(p["state"] == "done" for p in parts)
        for part in parts:
            # Live figures: set from the step's start (running time so far), null before.
            started = part["state"] != "pending"
            assert (part["synth_ms"] is not None) == started, part
            assert (part["gpu_ms"] is not None) == (part["state"] in ("gpu", "done")), part
    synthesized = [p for p in a["partitions"] if p["state"] != "synthesizing"
                   and p["synth_ms"] is not None]  # fmt: skip
    assert synthesized, a
    # 30.4 s at 2 active; the first proof after the start is 1.25 times slower, without a PCE
    # 1.4 times slower again.
    first = 30_400 * 1.25 * model.NO_PCE_SYNTHESIS_FACTOR
    assert synthesized[0]["synth_ms"] == pytest.approx(first, rel=0.01)
    workers = doc["gpu_workers"]
    assert [w["worker_id"] for w in workers] == [0, 1]
    assert [w["gpu_ordinal"] for w in workers] == [0, 0]
    for worker in workers:
        assert list(worker) == ["worker_id", "gpu_ordinal", "state", "current_job",
                                "current_partition", "busy_secs"]  # fmt: skip
        assert worker["state"] in ("idle", "proving")
        if worker["state"] == "proving":
            assert worker["current_job"] in ("a", "b")
            assert 0 <= worker["current_partition"] < 10
            # The time since this pickup: at most the GPU stage of two partitions in turn.
            assert 0 <= worker["busy_secs"] <= 2 * 61 + 1
        else:
            assert (worker["current_job"], worker["current_partition"]) == (None, None)
            assert worker["busy_secs"] is None
    assert list(doc["counters"]) == ["total_completed", "total_failed", "completed_by_kind",
                                     "failed_by_kind", "queue_depth"]  # fmt: skip
    assert list(doc["buffers"]) == ["synth_in_flight", "provers_in_flight", "aux_in_flight",
                                    "shells_in_flight", "pending_handles"]  # fmt: skip
    assert [s["circuit_id"] for s in doc["allocations"]["srs"]] == ["porep-32g"]
    assert doc["sim"]["gpu_factor"] == 20
    assert doc["sim"]["cpu_busy_share"] is None  # not without --cpu-share
    # GPU-bound: one GPU proves a partition per 60 s, 2 slots synthesize one per 15.2 s.
    assert doc["sim"]["steady_state_proofs_per_hour"] == pytest.approx(6.0, abs=1e-3)


def test_a_failed_synthesis_leaks_active_and_stays_listed(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    """status.rs: the failed partition's +1 on ``active`` is never taken back, its job is never
    completed (listed for the daemon's life, its waiting partitions ``pending``), a synthesis
    failure is not in ``counters.total_failed``; a completed job goes after 30 s."""
    port = free_tcp_port()
    sim = sim_factory(config=config(tmp_path, port), time_scale=2000,
                      args=["--fault", "fail:synthesis broke,at_partition=4"])  # fmt: skip
    stub = sim.stub()
    failed = stub.Prove(pb.ProveRequest(submit=submit_request("bad")), timeout=20).result
    assert failed.status == pb.AwaitProofResponse.FAILED
    good = stub.Prove(pb.ProveRequest(submit=submit_request("good")), timeout=20).result
    assert good.status == pb.AwaitProofResponse.COMPLETED
    doc = status(port)
    assert doc["synthesis"]["active"] == 1  # leaked: nothing synthesizes now
    jobs = {p["job_id"]: p for p in doc["pipelines"]}
    assert "bad" in jobs  # "good" too for 30 simulated seconds (15 ms here): the unit test's
    states = [p["state"] for p in jobs["bad"]["partitions"]]
    assert states[4] == "failed"
    assert states[6:] == ["pending"] * 4  # skipped, never started
    assert set(states[:4]) <= {"done", "gpu"}  # synthesized before; proved or left at pickup
    assert doc["counters"]["total_completed"] == 1
    assert doc["counters"]["total_failed"] == 0
    # 30 simulated seconds after it completed the good job is gone; the failed one stays.
    later = poll_until(lambda: (d := status(port)) and len(d["pipelines"]) == 1 and d, 20,
                       what="the completed job dropped")  # fmt: skip
    assert later["pipelines"][0]["job_id"] == "bad"
    assert later["synthesis"]["active"] == 1


def test_busy_secs_is_the_time_since_the_current_pickup(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(config=config(tmp_path, port, workers=10), time_scale=400,
                      args=["--gpu-factor", "50"])  # fmt: skip
    sim.stub().SubmitProof(submit_request("only"), timeout=5)

    def second_partition_proving() -> dict[str, Any] | None:
        doc = status(port)
        parts = doc["pipelines"][0]["partitions"] if doc["pipelines"] else []
        return doc if sum(p["state"] == "done" for p in parts) >= 1 else None

    doc = poll_until(second_partition_proving, 30, what="a partition proved")
    # 150 s of CUDA a partition: a worker proving now picked its partition up less than two
    # partitions' time ago, however long it has been proving since the start.
    busy = [w["busy_secs"] for w in doc["gpu_workers"] if w["state"] == "proving"]
    assert busy
    assert all(0 <= b <= 2 * 151 for b in busy)
    gpu = [p["gpu_ms"] for p in doc["pipelines"][0]["partitions"] if p["state"] == "gpu"]
    assert all(0 <= ms <= 2 * 151_000 for ms in gpu)


def test_cpu_share_slows_synthesis_and_reports_the_cpu_busy(
    tmp_path: Path, sim_factory: Callable[..., SimProcess]
) -> None:
    port = free_tcp_port()
    sim = sim_factory(config=config(tmp_path, port), time_scale=400, args=["--cpu-share", "0.05"])
    sim.stub().SubmitProof(submit_request("c"), timeout=5)

    def synthesized() -> dict[str, Any] | None:
        doc = status(port)
        parts = doc["pipelines"][0]["partitions"] if doc["pipelines"] else []
        done = [p for p in parts if p["state"] not in ("pending", "synthesizing")]
        return doc if done and doc["synthesis"]["active"] == 2 else None

    doc = poll_until(synthesized, 20, what="a synthesized partition, two synthesizing")
    part = next(p for p in doc["pipelines"][0]["partitions"]
                if p["state"] not in ("pending", "synthesizing"))  # fmt: skip
    # Two partitions need 0.1 of the reference machine's CPU and get 0.05: 58 s each instead of
    # 30.4, times the first proof's factors (after a start, without a PCE).
    first = 58_000 * 1.25 * model.NO_PCE_SYNTHESIS_FACTOR
    assert part["synth_ms"] == pytest.approx(first, rel=0.01)
    assert doc["sim"]["cpu_share"] == 0.05
    assert doc["sim"]["cpu_busy_share"] == 1.0


def test_model_cpu_figures() -> None:
    assert model.partition_seconds(2, cpu_share=1.0) == pytest.approx(30.4)
    assert model.partition_seconds(2, cpu_share=0.05) == pytest.approx(58.0)
    # On a fifth of the CPU, 6 partitions more than fill it: more only share it (no gain).
    assert 6 / model.partition_seconds(6, 0.2) == pytest.approx(
        12 / model.partition_seconds(12, 0.2)
    )
    assert model.cpu_busy_share(2, 1.0) == pytest.approx(0.1)
    assert model.cpu_busy_share(12, 1.0) == pytest.approx(0.6)
    assert model.cpu_busy_share(8, 0.2) == 1.0
    assert model.cpu_busy_share(0, 0.3) == 0.0
