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


def time_scale(reference: float = 400.0) -> float:
    """``reference`` on the reference machine, slower on a slow or busy one (pacehelpers)."""
    return scaled(reference)


def bench(
    tmp_path: Path, mgr: Any, scale: float | None = None, **settings: Any
) -> tuple[dict[str, Any], Supervisor]:
    """One whole lifecycle; the ``bound`` of its ``bench.result``."""
    values: dict[str, Any] = {
        "exit_after_run": "true",
        "bench_count": 6,
        "bench_status_sample_s": 0.04,
        # The in-flight counts these verdicts are about, none queued ahead (issue 42's default
        # two more would turn the one-proof case below into three).
        "bench_queue_ahead": 0,
        **settings,
    }
    run = start_run(lifecycle_env(tmp_path, mgr.url, time_scale=scale or time_scale(), **values))
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
    # 5 partition workers deliver a partition per 6.9 s; one GPU at 24 s of CUDA work proves one
    # per 24 s, its two workers taking turns.
    found, _ = bench(tmp_path, manager(), workers=5, sim_args=("--gpu-factor", "8"))
    assert found["bound"] == "gpu-bound", found
    evidence = found["evidence"]
    assert evidence["gpu_busy_share"] >= 0.9
    assert evidence["synth_done_waiting"] >= 1
    assert evidence["gpu_utilisation"] >= 0.9  # the simulated GPU's own figure, as NVML's
    assert evidence["gpu_s"] > 24.0  # the GPU stage: preparation, the wait, CUDA, finalization
    assert "more RAM would not raise the rate" in found["reason"]
    more_workers = projection(found, "more-workers")["rate"]
    one_more_gpu = projection(found, "one-more-gpu")["rate"]
    as_run = projection(found, "as-run")["rate"]
    assert more_workers == pytest.approx(as_run, rel=0.01)
    assert one_more_gpu > 1.5 * as_run


def test_a_slow_cpu_around_the_gpu_is_not_named_gpu_bound(tmp_path, manager):
    # Preparation and finalization 30 times slower (15 s each around 3 s of CUDA work): the
    # GPU workers prove all the time while the GPU itself is used about a third of it.
    found, _ = bench(tmp_path, manager(), workers=10, sim_args=("--gpu-cpu-factor", "30"))
    assert found["bound"] == "gpu-stage-bound", found
    assert found["limit"] == "cpu"
    assert found["evidence"]["gpu_busy_share"] >= 0.9
    assert found["evidence"]["gpu_utilisation"] < 0.5
    assert "the CPU work around the GPU" in found["reason"]


@pytest.mark.parametrize(
    ("workers", "cpu_share", "limit"),
    [(5, "1", "partition-workers"), (5, "0.15", "cpu"), (12, "1", "memory-bandwidth")],
)  # fmt: skip
def test_synthesis_flat_out_is_named_synthesis_bound_with_its_limit(
    tmp_path, manager, workers, cpu_share, limit
):
    """12 workers on one GPU (3 in flight to keep them fed) is the field's most common machine:
    read against the workers the plan rendered, not synthesis.max_concurrent (26 there)."""
    # 3 in flight drain over the batch's last 2 proofs (left out): 12 proofs, and at 12 workers
    # (a proof per 42.5 s) a slower clock, so the stretch holds its 8 samples on a busy machine.
    found, _ = bench(tmp_path, manager(), time_scale(200 if workers > 10 else 400), workers=workers,
                     bench_concurrency=3, bench_count=12,
                     sim_args=("--cpu-share", cpu_share))  # fmt: skip
    assert found["bound"] == "synthesis-bound", found
    assert found["limit"] == limit
    evidence = found["evidence"]
    assert evidence["partition_workers"] == workers
    assert evidence["max_concurrent"] == (70 + 14 * workers) // 9
    assert evidence["synthesis_load"] >= 0.9
    assert evidence["gpu_busy_share"] < 0.9
    as_run = projection(found, "as-run")["rate"]
    more = projection(found, "more-workers")
    if limit == "partition-workers":
        assert more["rate"] > 1.3 * as_run
    else:  # a full CPU, or the memory bandwidth past 10 workers: no gain
        assert more["rate"] == pytest.approx(as_run, rel=0.02)


def test_one_proof_in_flight_on_12_workers_is_named_feed_bound(tmp_path, manager):
    # 12 workers take a whole proof at once; while it is on the GPU nothing synthesizes.
    found, _ = bench(tmp_path, manager(), 200, workers=12, bench_concurrency=1)
    assert found["bound"] == "feed-bound", found
    assert "the 1 proofs in flight did not keep the pipeline full" in found["reason"]
    as_run = projection(found, "as-run")["rate"]
    assert projection(found, "one-more-in-flight")["rate"] > 1.2 * as_run


def test_eight_gpus_proving_with_partitions_waiting_are_named_gpu_bound(tmp_path, manager):
    found, _ = bench(tmp_path, manager(), workers=12, bench_concurrency=3, bench_count=12,
                     sim_args=("--gpus", "8", "--gpu-factor", "40"))  # fmt: skip
    assert found["bound"] == "gpu-bound", found
    assert (found["evidence"]["gpus"], found["evidence"]["gpu_workers"]) == (8, 16)


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
    few partition workers; they are the bound, and the projection of more workers says the
    memory allows no more (issue 33: bounded by what memory allows)."""
    found, run = bench(tmp_path, manager(), sim_args=("--host-gib", "128", "--cpu-share", "1"))
    (plan,) = run.named("plan.made")[-1:]
    assert plan["full_workers"] <= 3, plan
    assert found["bound"] == "synthesis-bound", found
    assert found["limit"] == "partition-workers"
    more = projection(found, "more-workers")
    assert f"the memory allows {plan['full_workers']} partition workers" in more["assumptions"]
    assert more["rate"] == pytest.approx(projection(found, "as-run")["rate"])
