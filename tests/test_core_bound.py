"""core.bound and its parts: what bounds the rate, from the daemon's status read as the daemon
means it (status.rs: fixtures in tests/fixtures/daemon_status, written in its shape), and the
projections (issues 25 and 33)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_supervisor.core import bound, contention
from cuzk_supervisor.core.bound import (
    Bound,
    GpuActivity,
    GpuWorkerSample,
    PartitionSample,
    PipelineSample,
    Shape,
    StatusSample,
    judge,
    parse_status,
)
from cuzk_supervisor.core.boundevidence import gather, without_drain
from cuzk_supervisor.core.boundsample import finished_times

FIXTURES = Path(__file__).parent / "fixtures" / "daemon_status"
SHAPE = Shape(partition_workers=4, concurrency=2, gpus=1)


def fixture(name: str) -> tuple[list[StatusSample], Shape]:
    series: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    nvml = series["nvml"] or [None] * len(series["documents"])
    samples = []
    for i, (doc, util) in enumerate(zip(series["documents"], nvml, strict=True)):
        gpus = () if util is None else (GpuActivity(0, util),)
        sample = parse_status(doc, i * series["interval_s"], gpus=gpus)
        assert sample is not None
        samples.append(sample)
    return samples, Shape(series["workers"], series["concurrency"])


# --- the acceptance: status documents in status.rs's shape -----------------------------------


def test_a_12_worker_machine_synthesizing_flat_out_is_synthesis_bound() -> None:
    samples, shape = fixture("synthesis_bound_12w_1gpu")
    assert {s.synth_max for s in samples} == {26}  # the budget over 9 GiB: never the limiter
    verdict = judge(samples, shape, rate_per_hour=85.0)
    assert verdict.bound is Bound.SYNTHESIS, verdict.reason
    # 12 workers: docs/daemon.md's measured figures show no gain past 10.
    assert verdict.limit == "memory-bandwidth"
    e = verdict.evidence
    assert (e.partition_workers, e.max_concurrent) == (12, 26)
    assert e.synthesis_load == pytest.approx(1.0)
    # The failed job from before: its +1 on active and its 7 pending partitions left out.
    assert (e.leaked_active, e.ghost_pipelines) == (1, 1)
    assert e.pending_waiting == pytest.approx(12.0)
    assert "left out: 1 on synthesis.active leaked by failed syntheses; 1 failed job" in (
        verdict.reason
    )
    assert e.gpu_busy_share == pytest.approx(13 / 20)
    # Read as before (the limiter = max_concurrent) it was feed-bound: 13 of 26 "in use".
    assert bound.FULL > 13 / 26


def test_an_8_gpu_machine_proving_on_every_worker_with_partitions_waiting_is_gpu_bound() -> None:
    samples, shape = fixture("gpu_bound_8gpu")
    verdict = judge(samples, shape, rate_per_hour=24.0)
    assert verdict.bound is Bound.GPU, verdict.reason
    assert (verdict.evidence.gpus, verdict.evidence.gpu_workers) == (8, 16)
    assert verdict.evidence.synth_done_waiting == pytest.approx(8.0)
    assert "more RAM would not raise the rate" in verdict.reason


def test_one_proof_in_flight_on_12_workers_is_feed_bound() -> None:
    samples, shape = fixture("feed_one_proof_12w")
    verdict = judge(samples, shape, rate_per_hour=48.0)
    assert verdict.bound is Bound.FEED, verdict.reason
    assert "the 1 proofs in flight did not keep the pipeline full" in verdict.reason
    more = verdict.projection("one-more-in-flight")
    assert more is not None
    assert more.rate_per_hour > 1.3 * 48.0


def test_workers_proving_on_a_gpu_nvml_calls_30_percent_used_is_not_gpu_bound() -> None:
    samples, shape = fixture("gpu_stage_cpu_nvml30")
    verdict = judge(samples, shape, rate_per_hour=40.0)
    assert verdict.bound is Bound.GPU_STAGE, verdict.reason
    assert verdict.limit == "cpu"
    assert "NVML says the GPUs are used 30 %: the CPU work around the GPU" in verdict.reason
    # Without NVML the same status is the GPU's.
    plain = [dataclasses.replace(s, gpus=()) for s in samples]
    assert judge(plain, shape).bound is Bound.GPU


def test_without_the_partition_workers_the_most_seen_synthesizing_stand_in() -> None:
    samples, shape = fixture("synthesis_bound_12w_1gpu")
    verdict = judge(samples, dataclasses.replace(shape, partition_workers=0))
    assert verdict.evidence.partition_workers == 12  # not max_concurrent's 26
    assert verdict.evidence.workers_source.startswith("not told")
    assert "[partition workers 12: not told" in verdict.line()


# --- thin evidence ---------------------------------------------------------------------------


def sample(
    at: float, *, synthesizing: int = 4, pending: int = 2, proving: int = 0, workers: int = 2,
    waiting: int = 0, cpu: float | None = None, active: int | None = None,
) -> StatusSample:  # fmt: skip
    states = (["synthesizing"] * synthesizing + ["pending"] * pending + ["synth_done"] * waiting
              + ["gpu"] * proving + ["done"])  # fmt: skip
    parts = tuple(PartitionSample(i, s, 30_000.0, 3_000.0) for i, s in enumerate(states))
    gpu = tuple(GpuWorkerSample(w, 0, w < proving, "j" if w < proving else None)
                for w in range(workers))  # fmt: skip
    second = PipelineSample("k", (PartitionSample(0, "done", 30_000.0, 3_000.0),), 10)
    pipelines = (PipelineSample("j", parts, len(parts)), second)
    return StatusSample(at, 26, synthesizing if active is None else active, pipelines, gpu, cpu)


def samples(n: int = 20, **kwargs: Any) -> list[StatusSample]:
    return [sample(float(i), **kwargs) for i in range(n)]


def test_no_samples_is_unknown_and_says_why() -> None:
    verdict = judge([], SHAPE)
    assert verdict.bound is Bound.UNKNOWN
    assert "no status samples" in verdict.reason
    assert (verdict.projections, verdict.evidence.samples) == ((), 0)


@pytest.mark.parametrize("n", [1, 2, bound.MIN_SAMPLES - 1])
def test_too_few_samples_is_unknown_even_when_they_look_gpu_bound(n: int) -> None:
    verdict = judge(samples(n, proving=2, waiting=8), SHAPE)
    assert verdict.bound is Bound.UNKNOWN
    assert verdict.reason == f"only {n} status samples (need {bound.MIN_SAMPLES})"
    assert verdict.line().startswith("unknown: only")


def test_samples_outside_the_window_do_not_count() -> None:
    many = samples(30, proving=2, waiting=5)
    assert judge(many, SHAPE).bound is Bound.GPU
    assert judge(many, SHAPE, window=(0.0, 5.0)).bound is Bound.UNKNOWN
    assert judge(many, SHAPE, window=(5.0, 20.0)).evidence.samples == 16


def test_no_gpu_worker_in_the_status_is_unknown() -> None:
    verdict = judge(samples(20, workers=0), SHAPE)
    assert (verdict.bound, verdict.reason) == (Bound.UNKNOWN, "no GPU worker in the status")


def test_the_drain_after_the_last_full_sample_is_left_out() -> None:
    full = samples(10)
    drain = [dataclasses.replace(s, at=10.0 + i, pipelines=s.pipelines[:1]) for i, s in
             enumerate(full[:5])]  # fmt: skip
    assert [s.in_flight for s in full[:1] + drain[:1]] == [2, 1]
    assert len(without_drain(full + drain, 2)) == 10
    assert len(without_drain(full + drain, 1)) == 15


# --- the rules ----------------------------------------------------------------------------


def test_synthesis_bound_reads_the_workers_from_the_shape_not_max_concurrent() -> None:
    verdict = judge(samples(20), SHAPE)
    assert verdict.bound is Bound.SYNTHESIS
    assert "the 4 partition workers' capacity 100 % in use" in verdict.reason
    assert verdict.evidence.max_concurrent == 26


@pytest.mark.parametrize(
    ("cpu", "workers", "limit", "words"),
    [
        (None, 4, None, "its busy share not known"),
        (0.95, 4, "cpu", "the CPU is the limit (busy 95 %)"),
        (0.6, 4, "partition-workers", "the partition workers the plan allowed are the limit"),
        (0.6, 10, "memory-bandwidth", "the memory bandwidth is the limit"),
    ],
)
def test_synthesis_bound_names_its_limit(
    cpu: float | None, workers: int, limit: str | None, words: str
) -> None:
    many = samples(20, synthesizing=workers, cpu=cpu)
    verdict = judge(many, Shape(workers, 2))
    assert (verdict.bound, verdict.limit) == (Bound.SYNTHESIS, limit)
    assert words in verdict.reason


def test_a_leaked_active_is_not_a_partition_synthesizing() -> None:
    # active says 4 (2 leaked by failed syntheses) but only 2 synthesize: not full.
    verdict = judge(samples(20, synthesizing=2, active=4), SHAPE)
    assert verdict.bound is Bound.FEED
    assert verdict.evidence.leaked_active == 2


def test_a_worker_shown_proving_a_failed_jobs_partition_is_idle() -> None:
    ghost = PipelineSample("g", (PartitionSample(0, "failed"), PartitionSample(1, "gpu")), 2)
    many = [dataclasses.replace(
        s, pipelines=(*s.pipelines, ghost),
        gpu_workers=(GpuWorkerSample(0, 0, True, "g"), GpuWorkerSample(1, 0, True, "g")),
    ) for s in samples(20, synthesizing=2)]  # fmt: skip
    evidence = judge(many, SHAPE).evidence
    assert evidence.gpu_busy_share == 0.0
    assert evidence.ghost_pipelines == 1


def test_gpu_busy_per_gpu_either_worker() -> None:
    # One worker of each of 2 GPUs proving: both GPUs busy (their workers take turns).
    many = [dataclasses.replace(s, gpu_workers=tuple(
        GpuWorkerSample(w, w // 2, w % 2 == 0, "j") for w in range(4)
    )) for s in samples(20, synthesizing=1, waiting=3)]  # fmt: skip
    verdict = judge(many, Shape(4, 2, 2))
    assert verdict.evidence.gpu_busy_share == 1.0
    assert verdict.evidence.gpu_both_share == 0.0
    assert verdict.bound is Bound.GPU


def test_both_saturated_with_nothing_waiting_is_mixed() -> None:
    verdict = judge(samples(20, proving=2), SHAPE)
    assert verdict.bound is Bound.MIXED
    assert "both near their limit" in verdict.reason


def test_neither_saturated_is_feed_bound() -> None:
    verdict = judge(samples(20, synthesizing=2, pending=0), SHAPE)
    assert verdict.bound is Bound.FEED
    assert "the 2 proofs in flight did not keep the pipeline full" in verdict.reason


def test_only_finished_steps_are_timed() -> None:
    one = StatusSample(0.0, 2, 2, (PipelineSample("a", (
        PartitionSample(0, "synth_done", 30_000, None),
        PartitionSample(1, "synthesizing", 12_000, None),  # live: not a duration
        PartitionSample(2, "gpu", 30_000, 1_500),  # live GPU figure
    ), 10),))  # fmt: skip
    two = StatusSample(1.0, 2, 2, (PipelineSample("a", (
        PartitionSample(0, "done", 30_000, 3_000),
        PartitionSample(1, "synth_done", 40_000, None),
    ), 10), PipelineSample("b", (PartitionSample(0, "done", 50_000, 6_000),), 10)))  # fmt: skip
    synth, gpu = finished_times([one, two, two])
    assert sorted(synth) == [30.0, 30.0, 40.0, 50.0]
    assert sorted(gpu) == [3.0, 6.0]
    evidence = gather([one, two], SHAPE)
    assert (evidence.partitions_per_proof, evidence.partitions_timed) == (10, 2)


def test_to_dict_is_json_and_the_line_says_the_workers_source() -> None:
    verdict = judge(samples(20, synthesizing=2, proving=2, waiting=3), SHAPE, rate_per_hour=30.0)
    document = json.loads(json.dumps(verdict.to_dict()))
    assert document["bound"] == "gpu-bound"
    assert document["evidence"]["partition_workers"] == 4
    names = [p["name"] for p in document["projections"]]
    assert names == ["as-run", "more-workers", "one-more-in-flight", "one-more-gpu"]
    assert all(p["assumptions"] for p in document["projections"])
    assert "[partition workers 4: the plan]" in verdict.line()
    assert "one more GPU (2 GPUs) ~" in verdict.line()


# --- NVML's figures ----------------------------------------------------------------------------


def test_nvml_figures_are_averaged_and_a_held_down_clock_is_said_in_the_reason() -> None:
    hot = (GpuActivity(0, 0.99, 0.6, ("thermal",)), GpuActivity(1, 0.95, 1.0, ()))
    cool = (GpuActivity(0, 0.97, 1.0, ()), GpuActivity(1, 0.97, 1.0, ()))
    gpu_bound = samples(10, proving=2, waiting=3)
    mixed = [dataclasses.replace(s, gpus=hot if i < 4 else cool) for i, s in enumerate(gpu_bound)]
    verdict = judge(mixed, SHAPE)
    assert verdict.bound == Bound.GPU
    evidence = verdict.to_dict()["evidence"]
    assert evidence["gpu_utilisation"] == pytest.approx(0.97)
    assert evidence["slowdown_share"] == pytest.approx(0.4)
    assert evidence["slowdowns"] == ["thermal"]
    assert "NVML utilisation 97 %" in verdict.reason
    assert "clocks held down (thermal) in 40 % of the samples" in verdict.reason
    calm = [dataclasses.replace(s, gpus=cool) for s in gpu_bound]
    assert "held down" not in judge(calm, SHAPE).reason
    plain = judge(gpu_bound, SHAPE)
    assert "NVML" not in plain.reason
    assert plain.to_dict()["evidence"]["gpu_utilisation"] is None


# --- properties ----------------------------------------------------------------------------

samples_strategy = st.lists(
    st.builds(
        sample,
        st.floats(0, 1000),
        synthesizing=st.integers(0, 8),
        pending=st.integers(0, 8),
        proving=st.integers(0, 4),
        workers=st.integers(0, 4),
        waiting=st.integers(0, 8),
        cpu=st.none() | st.floats(0, 1),
        active=st.none() | st.integers(0, 12),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(many=samples_strategy, workers=st.integers(0, 30), concurrency=st.integers(1, 8),
       rate=st.none() | st.floats(0.1, 500))  # fmt: skip
def test_any_samples_give_a_verdict_with_sane_figures(
    many: list[StatusSample], workers: int, concurrency: int, rate: float | None
) -> None:
    verdict = judge(many, Shape(workers, concurrency), rate_per_hour=rate)
    e = verdict.evidence
    for share in (e.gpu_busy_share, e.synthesis_load, e.workers_busy_share, e.cpu_busy_share):
        assert share is None or 0.0 <= share <= 1.0 + 1e-9
    if len(many) < bound.MIN_SAMPLES:
        assert verdict.bound is Bound.UNKNOWN
    if verdict.bound not in (Bound.SYNTHESIS, Bound.GPU_STAGE):
        assert verdict.limit is None
    json.dumps(verdict.to_dict())
    assert verdict.line().startswith(str(verdict.bound))
    rates = {p.name: p.rate_per_hour for p in verdict.projections}
    if rates:  # one more of anything never lowers the modelled rate
        assert rates["as-run"] == pytest.approx(rate)
        assert all(rates[name] >= rates["as-run"] * (1 - 1e-9) for name in rates)


# --- the measured contention ---------------------------------------------------------------


def test_the_contention_table_is_cuzk_md_s() -> None:
    for workers, seconds in contention.SECONDS_PER_PROOF:
        assert contention.proofs_per_hour(workers) == pytest.approx(3600 / seconds)
    assert contention.proofs_per_hour(4) == pytest.approx((2 * 3600 / 68.4 + 3600 / 152) / 3)
    assert contention.proofs_per_hour(20) == contention.proofs_per_hour(12)  # the plateau
    assert contention.proofs_per_hour(0) == 0.0
    assert contention.partition_seconds(2) == pytest.approx(30.4)
    assert contention.gain(2, 4) == pytest.approx(1.815, abs=1e-3)
    assert (contention.plateau(7), contention.plateau(10)) == (False, True)
