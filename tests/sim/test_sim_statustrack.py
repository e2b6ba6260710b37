"""sim.daemon.statustrack: the tracker computes each field as cuzk-core/src/status.rs does."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim.daemon.statustrack import StatusTracker


def tracker(workers: int = 2) -> StatusTracker:
    t = StatusTracker()
    t.register_workers([(w, w // 2) for w in range(workers)])
    return t


def part(doc: dict, job: str, index: int) -> dict:
    pipeline = next(p for p in doc["pipelines"] if p["job_id"] == job)
    return pipeline["partitions"][index]


def test_times_are_live_while_a_step_runs_and_truncated_to_the_millisecond() -> None:
    t = tracker()
    t.register_job("a", "porep-c2", 10, now=1.0)
    assert part(t.snapshot(2.0), "a", 0) == {"index": 0, "state": "pending", "synth_ms": None,
                                             "gpu_ms": None}  # fmt: skip
    t.partition_synth_start("a", 0, now=2.0)
    assert part(t.snapshot(3.0009), "a", 0)["synth_ms"] == 1000  # as_millis truncates
    t.partition_synth_end("a", 0, now=32.4)
    t.partition_gpu_start("a", 0, worker_id=1, now=40.0)
    doc = t.snapshot(41.5)
    assert part(doc, "a", 0) == {"index": 0, "state": "gpu", "synth_ms": 30400, "gpu_ms": 1500}
    assert doc["pipelines"][0]["started_secs_ago"] == pytest.approx(40.5)  # since registration
    t.partition_gpu_end("a", 0, worker_id=1, now=44.0)
    assert part(t.snapshot(100.0), "a", 0)["gpu_ms"] == 4000


def test_active_leaks_upward_after_a_failed_synthesis() -> None:
    t = tracker()
    t.register_job("a", "porep-c2", 10, now=0.0)
    for i in range(3):
        t.partition_synth_start("a", i, now=0.0)
    t.partition_failed("a", 1)
    t.partition_synth_end("a", 0, now=30.0)
    t.partition_synth_end("a", 2, now=30.0)
    doc = t.snapshot(31.0)
    assert doc["synth_active"] == 1  # nothing synthesizes; the failure's +1 stays
    assert part(doc, "a", 1) == {"index": 1, "state": "failed", "synth_ms": 31000,
                                 "gpu_ms": None}  # fmt: skip


def test_a_failed_job_stays_listed_and_a_completed_one_goes_after_30_whole_seconds() -> None:
    t = tracker()
    t.register_job("bad", "porep-c2", 10, now=0.0)
    t.register_job("good", "porep-c2", 10, now=0.0)
    t.partition_synth_start("bad", 0, now=0.0)
    t.partition_failed("bad", 0)
    t.job_completed("good", "porep-c2", success=True, now=100.0)
    assert [p["job_id"] for p in t.snapshot(129.99)["pipelines"]] == ["bad", "good"]
    assert [p["job_id"] for p in t.snapshot(130.0)["pipelines"]] == ["bad"]
    doc = t.snapshot(10_000.0)
    assert [p["job_id"] for p in doc["pipelines"]] == ["bad"]
    # A synthesis failure is never job_completed: not counted as failed.
    assert doc["counters"]["total_failed"] == 0
    assert doc["counters"]["total_completed"] == 1
    assert doc["counters"]["completed_by_kind"] == {"porep-c2": 1}


def test_busy_secs_counts_from_the_current_pickup_and_a_late_finalizer_keeps_the_new_one() -> None:
    t = tracker()
    t.register_job("a", "porep-c2", 10, now=0.0)
    t.partition_gpu_start("a", 0, worker_id=0, now=10.0)
    (w0, w1) = t.snapshot(12.0)["gpu_workers"]
    assert w0 == {"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "a",
                  "current_partition": 0, "busy_secs": 2.0}  # fmt: skip
    assert w1 == {"worker_id": 1, "gpu_ordinal": 0, "state": "idle", "current_job": None,
                  "current_partition": None, "busy_secs": None}  # fmt: skip
    # Split proving: the worker picks up partition 1 before partition 0's finalizer ends.
    t.partition_gpu_start("a", 1, worker_id=0, now=13.5)
    t.partition_gpu_end("a", 0, worker_id=0, now=14.0)
    (w0, _) = t.snapshot(15.0)["gpu_workers"]
    assert (w0["state"], w0["current_partition"], w0["busy_secs"]) == ("proving", 1, 1.5)
    assert part(t.snapshot(15.0), "a", 0)["state"] == "done"
    t.partition_gpu_end("a", 1, worker_id=0, now=17.0)
    (w0, _) = t.snapshot(18.0)["gpu_workers"]
    assert (w0["state"], w0["busy_secs"]) == ("idle", None)


def test_a_second_job_under_one_id_replaces_the_first_record() -> None:
    t = tracker()
    t.register_job("x", "porep-c2", 10, now=0.0)
    t.partition_synth_start("x", 0, now=0.0)
    t.register_job("x", "porep-c2", 10, now=5.0)
    doc = t.snapshot(6.0)
    assert len(doc["pipelines"]) == 1
    assert part(doc, "x", 0)["state"] == "pending"
    assert doc["synth_active"] == 1
