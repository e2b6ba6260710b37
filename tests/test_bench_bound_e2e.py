"""The bench names what bounds its rate (issue 25): each bound kind produced by a simulator flag,
named by the supervisor from the daemon's HTTP status sampled over the bench, with its evidence,
in ``bench.result``, the state file and a benchout line at the manager.

The supervisor and the simulated daemon and manager run as real processes in scaled time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from daemonhelpers import Supervisor
from lifecyclehelpers import lifecycle_env, start_run
from pacehelpers import scaled

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow


def time_scale() -> float:
    """400 on the reference machine, slower on a slow or busy one (pacehelpers)."""
    return scaled(400.0)


def bench(tmp_path: Path, mgr: Any, **settings: Any) -> tuple[dict[str, Any], Supervisor]:
    """One whole lifecycle; the ``bound`` of its ``bench.result``."""
    values: dict[str, Any] = {
        "exit_after_run": "true",
        "bench_count": 6,
        "bench_status_sample_s": 0.04,
        **settings,
    }
    run = start_run(lifecycle_env(tmp_path, mgr.url, time_scale=time_scale(), **values))
    try:
        assert run.wait(60) == exitcodes.OK
    finally:
        run.kill()
    (result,) = run.named("bench.result")
    found: dict[str, Any] = result["bound"]
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert state["bench"][-1]["bound"] == found
    uuid = run.named("manager.registered")[0]["uuid"]
    lines = mgr.get(f"/api/instance-logs/{uuid}", params={"source": "benchout"}).json()
    said = [line["text"] for line in lines if line["text"].startswith(found["bound"] + ":")]
    assert said, [line["text"] for line in lines]
    assert found["evidence"]["samples"] >= 8, found
    return found, run


def projection(found: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in found["projections"] if p["name"] == name)


def test_slow_gpus_are_named_gpu_bound(tmp_path, manager):
    # 5 partition workers deliver a partition per 6.8 s; 2 GPU workers at 24 s prove one per 12.
    found, _ = bench(tmp_path, manager(), workers=5, sim_args=("--gpu-factor", "8"))
    assert found["bound"] == "gpu-bound", found
    evidence = found["evidence"]
    assert evidence["gpu_busy_share"] >= 0.9
    assert evidence["synth_done_waiting"] >= 1
    assert evidence["gpu_s"] == pytest.approx(24.0)
    assert "more RAM would not raise the rate" in found["reason"]
    more_workers = projection(found, "more-workers")["rate"]
    one_more_gpu = projection(found, "one-more-gpu")["rate"]
    as_run = projection(found, "as-run")["rate"]
    assert more_workers == pytest.approx(as_run, rel=0.01)
    assert one_more_gpu > 1.5 * as_run


@pytest.mark.parametrize(
    ("cpu_share", "limit"), [("1", "partition-workers"), ("0.3", "cpu")]
)  # fmt: skip
def test_slow_synthesis_is_named_synthesis_bound_with_its_limit(
    tmp_path, manager, cpu_share, limit
):
    found, _ = bench(tmp_path, manager(), workers=5, sim_args=("--cpu-share", cpu_share))
    assert found["bound"] == "synthesis-bound", found
    assert found["limit"] == limit
    evidence = found["evidence"]
    assert evidence["limiter_use"] >= 0.9
    assert evidence["gpu_busy_share"] < 0.5
    as_run = projection(found, "as-run")["rate"]
    assert projection(found, "more-workers")["rate"] > 1.5 * as_run


def test_one_proof_in_flight_is_named_feed_bound(tmp_path, manager):
    # 10 workers take a whole proof at once; while it is on the GPUs the limiter has nothing.
    found, _ = bench(tmp_path, manager(), workers=10, bench_concurrency=1)
    assert found["bound"] == "feed-bound", found
    assert "concurrency 1 did not keep the pipeline full" in found["reason"]
    as_run = projection(found, "as-run")["rate"]
    assert projection(found, "one-more-in-flight")["rate"] > 1.2 * as_run


def test_sampling_off_reports_no_bound(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, time_scale=time_scale(), exit_after_run="true",
                        bench_count=4, bench_status_sample_s=0)  # fmt: skip
    run = start_run(env)
    try:
        assert run.wait(60) == exitcodes.OK
    finally:
        run.kill()
    (result,) = run.named("bench.result")
    assert "bound" not in result


def test_a_plan_held_down_by_memory_is_synthesis_bound_on_its_partition_workers(tmp_path, manager):
    """Memory-limited (issue 25, item 6): a machine with 128 GiB (``--host-gib``) is planned
    few partition workers; the limiter they make is the bound, and more workers (more RAM)
    would lift it."""
    found, run = bench(tmp_path, manager(), sim_args=("--host-gib", "128", "--cpu-share", "1"))
    (plan,) = run.named("plan.made")[-1:]
    assert plan["full_workers"] <= 3, plan
    assert found["bound"] == "synthesis-bound", found
    assert found["limit"] == "partition-workers"
    as_run = projection(found, "as-run")["rate"]
    assert projection(found, "more-workers")["rate"] > 1.3 * as_run
