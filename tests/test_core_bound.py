"""core.bound: what bounds the bench's rate, from the daemon's status samples, and the model's
projections (issue 25, items 2 and 3)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_supervisor.core import bound
from cuzk_supervisor.core.bound import (
    Bound,
    GpuActivity,
    GpuWorkerSample,
    PartitionSample,
    PipelineSample,
    Shape,
    StatusSample,
    judge,
    modelled_rate,
)
from cuzk_supervisor.sim.pipeline import JobProved, Pipeline

SHAPE = Shape(partition_workers=4, concurrency=2, gpus=1)


def sample(
    at: float,
    *,
    active: int = 4,
    slots: int = 4,
    proving: int = 0,
    workers: int = 2,
    states: tuple[str, ...] = (),
    cpu: float | None = None,
    job: str = "j",
    synth_ms: float | None = 30_000,
    gpu_ms: float | None = 3_000,
) -> StatusSample:
    parts = tuple(
        PartitionSample(
            i,
            state,
            synth_ms if state in ("synth_done", "gpu", "done") else None,
            gpu_ms if state == "done" else None,
        )
        for i, state in enumerate(states)
    )
    gpu = tuple(GpuWorkerSample(w, 0, w < proving) for w in range(workers))
    pipelines = (PipelineSample(job, parts, len(parts)),) if parts else ()
    return StatusSample(at, slots, active, pipelines, gpu, cpu)


def samples(n: int = 20, **kwargs: object) -> list[StatusSample]:
    return [sample(float(i), **kwargs) for i in range(n)]  # type: ignore[arg-type]


# --- thin evidence ---------------------------------------------------------------------------


def test_no_samples_is_unknown_and_says_why() -> None:
    verdict = judge([], SHAPE)
    assert verdict.bound is Bound.UNKNOWN
    assert "no status samples" in verdict.reason
    assert verdict.projections == ()
    assert verdict.evidence.samples == 0


@pytest.mark.parametrize("n", [1, 2, bound.MIN_SAMPLES - 1])
def test_too_few_samples_is_unknown_even_when_they_look_gpu_bound(n: int) -> None:
    states = ("synth_done",) * 8 + ("gpu", "gpu")
    verdict = judge(samples(n, proving=2, states=states), SHAPE)
    assert verdict.bound is Bound.UNKNOWN
    assert verdict.reason == f"only {n} status samples (need {bound.MIN_SAMPLES})"
    assert verdict.line().startswith("unknown: only")


def test_samples_outside_the_window_do_not_count() -> None:
    many = samples(30, proving=2, states=("synth_done",) * 5)
    assert judge(many, SHAPE).bound is Bound.GPU
    assert judge(many, SHAPE, window=(0.0, 5.0)).bound is Bound.UNKNOWN
    assert judge(many, SHAPE, window=(5.0, 20.0)).evidence.samples == 16


def test_no_gpu_worker_in_the_status_is_unknown() -> None:
    verdict = judge(samples(20, workers=0), SHAPE)
    assert verdict.bound is Bound.UNKNOWN
    assert verdict.reason == "no GPU worker in the status"


# --- each bound ----------------------------------------------------------------------------------


def test_gpu_bound_names_the_busy_workers_and_the_queue() -> None:
    states = ("synth_done",) * 12 + ("gpu", "gpu", "synthesizing")
    verdict = judge(samples(20, proving=2, states=states), SHAPE)
    assert verdict.bound is Bound.GPU
    assert verdict.reason == (
        "2 GPU workers busy 100 % of the time; 12.0 synthesized partitions waiting on average; "
        "more RAM would not raise the rate"
    )
    assert verdict.evidence.gpu_busy_share == 1.0
    assert verdict.evidence.synth_done_waiting == 12.0


def test_gpu_busy_with_an_unfull_limiter_and_no_queue_is_still_gpu_bound() -> None:
    verdict = judge(samples(20, proving=2, active=1, states=("gpu", "gpu")), SHAPE)
    assert verdict.bound is Bound.GPU


def test_both_saturated_is_mixed() -> None:
    verdict = judge(samples(20, proving=2, active=4, states=("gpu", "gpu")), SHAPE)
    assert verdict.bound is Bound.MIXED
    assert "both near their limit" in verdict.reason


@pytest.mark.parametrize(
    ("cpu", "limit", "words"),
    [
        (None, None, "CPU busy share not known"),
        (0.95, "cpu", "the CPU is the limit (busy 95 %)"),
        (0.6, "partition-workers", "the partition workers the plan allowed are the limit"),
    ],
)
def test_synthesis_bound_says_whether_the_workers_or_the_cpu_limit_it(
    cpu: float | None, limit: str | None, words: str
) -> None:
    states = ("pending",) * 6 + ("synthesizing",) * 4 + ("gpu",)
    verdict = judge(
        [sample(float(i), proving=i % 2, states=states, cpu=cpu) for i in range(20)], SHAPE
    )
    assert verdict.bound is Bound.SYNTHESIS
    assert verdict.limit == limit
    assert words in verdict.reason
    assert "the limiter's 4 slots 100 % in use, 2 GPU workers idle 75 % of the time" in (
        verdict.reason
    )


def test_neither_saturated_is_feed_bound() -> None:
    verdict = judge(samples(20, active=2, proving=1, states=("synthesizing",) * 2), SHAPE)
    assert verdict.bound is Bound.FEED
    assert verdict.reason == (
        "neither saturated (the limiter's 4 slots 50 % in use, 2 GPU workers busy 50 %): the "
        "bench's concurrency 2 did not keep the pipeline full"
    )


def test_thresholds_are_inclusive() -> None:
    # 9 of 10 samples with both workers proving: busy exactly BUSY.
    at_busy = [sample(float(i), proving=2 if i < 9 else 0, active=0, states=("gpu",))
               for i in range(10)]  # fmt: skip
    assert judge(at_busy, SHAPE).evidence.gpu_busy_share == pytest.approx(bound.BUSY)
    assert judge(at_busy, SHAPE).bound is Bound.GPU
    at_full = [sample(float(i), active=4 if i < 9 else 0) for i in range(10)]
    assert judge(at_full, SHAPE).bound is Bound.SYNTHESIS


# --- the figures ---------------------------------------------------------------------------------


def test_partition_times_count_each_partition_once_with_its_latest_figure() -> None:
    one = StatusSample(0.0, 2, 2, (PipelineSample("a", (
        PartitionSample(0, "synth_done", 30_000, None),
        PartitionSample(1, "synthesizing", None, None),
    ), 10),))  # fmt: skip
    two = StatusSample(1.0, 2, 2, (PipelineSample("a", (
        PartitionSample(0, "done", 30_000, 3_000),
        PartitionSample(1, "synth_done", 40_000, None),
    ), 10), PipelineSample("b", (PartitionSample(0, "done", 50_000, 6_000),), 10)))  # fmt: skip
    synth, gpu = bound.partition_times([one, two, two])
    assert sorted(synth) == [30.0, 40.0, 50.0]
    assert sorted(gpu) == [3.0, 6.0]
    evidence = bound.gather([one, two], SHAPE)
    assert evidence.synth_s == pytest.approx(40.0)
    assert evidence.gpu_s == pytest.approx(4.5)
    assert evidence.partitions_per_proof == 10
    assert evidence.partitions_timed == 2


def test_gpus_come_from_the_ordinals_seen() -> None:
    gpu = tuple(GpuWorkerSample(w, w // 2, True) for w in range(4))
    evidence = bound.gather([StatusSample(0.0, 4, 4, (), gpu)], Shape(4, 2, gpus=1))
    assert (evidence.gpus, evidence.gpu_workers) == (2, 4)


def test_to_dict_is_json_with_the_figures() -> None:
    states = ("synth_done",) * 3 + ("done",) * 2
    many = samples(20, proving=2, states=states, gpu_ms=60_000)
    verdict = judge(many, SHAPE, daemon_seconds_per_second=100)
    document = json.loads(json.dumps(verdict.to_dict()))
    assert document["bound"] == "gpu-bound"
    assert document["evidence"]["samples"] == 20
    assert document["evidence"]["synth_s"] == 30.0
    names = [p["name"] for p in document["projections"]]
    assert names == ["as-run", "more-workers", "one-more-in-flight", "one-more-gpu"]
    assert document["assumptions"]
    assert "; model, proofs/hour (as run " in verdict.line()
    assert "one more GPU (4 GPU workers) ~" in verdict.line()
    assert "8 partition workers" not in verdict.line()  # GPU-bound: no lift from more workers


def test_the_line_leaves_out_more_workers_while_the_cpu_is_the_limit() -> None:
    states = ("pending",) * 6 + ("synthesizing",) * 4 + ("synth_done", "done")
    workers_limit = judge(samples(20, proving=0, states=states, cpu=0.5), SHAPE)
    cpu_limit = judge(samples(20, proving=0, states=states, cpu=1.0), SHAPE)
    assert (workers_limit.limit, cpu_limit.limit) == ("partition-workers", "cpu")
    assert "8 partition workers ~" in workers_limit.line()
    assert "8 partition workers" not in cpu_limit.line()
    assert cpu_limit.projection("more-workers") is not None  # still in the figures


# --- the model -----------------------------------------------------------------------------------


def test_the_models_completions() -> None:
    # One proof at a time through 10 slots: 42.5 s of synthesis, 5 waves of 3 s on 2 GPU workers.
    done = bound.closed_loop_completions(10, 10, 2, 1, 42.5, 3.0, 3)
    assert done == pytest.approx([57.5, 115.0, 172.5])
    # Two waves of 5; the one GPU worker (15 s) is still on the first when the second ends.
    assert bound.closed_loop_completions(10, 5, 1, 1, 30.0, 15.0, 1) == [30 + 10 * 15]


def test_modelled_rate_names_the_binding_term() -> None:
    def rate(**kw: float) -> tuple[float, str]:
        args = {"synth_s": 30.0, "gpu_s": 3.0, "partitions": 10.0, "workers": 2,
                "gpu_workers": 2, "concurrency": 2, **kw}  # fmt: skip
        return modelled_rate(**args)  # type: ignore[arg-type]

    assert rate() == (pytest.approx(24.0), "synthesis")
    assert rate(gpu_s=60.0)[1] == "gpu"
    assert rate(workers=10, concurrency=1, synth_s=42.5) == (pytest.approx(3600 / 57.5), "feed")
    assert rate(partitions=0.4) == (0.0, "none")
    assert rate(daemon_seconds_per_second=100)[0] == pytest.approx(0.24)
    assert rate(workers=0) == (0.0, "none")
    assert rate(gpu_s=0.0) == (0.0, "none")


def closed_loop_rate(w: int, g: int, c: int, s: float, gs: float, proofs: int = 120) -> float:
    """The simulator's pipeline with constant step times: steady proofs per hour."""
    pipe = Pipeline(w, g, partition_seconds=lambda active: s, gpu_seconds=gs)
    done: list[float] = []
    for seq in range(c):
        pipe.submit(seq, 0.0)
    seq = c
    while len(done) < proofs:
        deadline = pipe.next_deadline()
        assert deadline is not None
        for event in pipe.advance(deadline):
            if isinstance(event, JobProved):
                done.append(event.at)
                pipe.submit(seq, event.at)
                seq += 1
    return (proofs - 40) / (done[-1] - done[39]) * 3600


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(1, 24),
    g=st.integers(1, 4),
    c=st.integers(1, 4),
    s=st.sampled_from([10.0, 30.0, 45.0]),
    gs=st.sampled_from([1.0, 3.0, 15.0, 60.0]),
)
def test_the_model_matches_the_simulators_pipeline_within_5_percent(
    w: int, g: int, c: int, s: float, gs: float
) -> None:
    modelled, _ = modelled_rate(synth_s=s, gpu_s=gs, partitions=10, workers=w, gpu_workers=g,
                                concurrency=c)  # fmt: skip
    truth = closed_loop_rate(w, g, c, s, gs)
    assert modelled == pytest.approx(truth, rel=0.05)


# --- properties ----------------------------------------------------------------------------------

state_lists = st.lists(st.sampled_from(sorted(bound.PARTITION_STATES)), max_size=20)
samples_strategy = st.lists(
    st.builds(
        sample,
        st.floats(0, 1000),
        active=st.integers(0, 8),
        slots=st.integers(0, 8),
        proving=st.integers(0, 4),
        workers=st.integers(0, 4),
        states=state_lists.map(tuple),
        cpu=st.none() | st.floats(0, 1),
        synth_ms=st.none() | st.floats(1, 1e6),
        gpu_ms=st.none() | st.floats(1, 1e6),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(many=samples_strategy, workers=st.integers(1, 30), concurrency=st.integers(1, 8))
def test_any_samples_give_a_verdict_with_sane_figures(
    many: list[StatusSample], workers: int, concurrency: int
) -> None:
    verdict = judge(many, Shape(workers, concurrency))
    e = verdict.evidence
    assert e.samples == len(many)
    for share in (e.gpu_busy_share, e.limiter_use, e.cpu_busy_share):
        assert share is None or 0.0 <= share <= 1.0
    if len(many) < bound.MIN_SAMPLES:
        assert verdict.bound is Bound.UNKNOWN
    if verdict.bound is not Bound.SYNTHESIS:
        assert verdict.limit is None
    json.dumps(verdict.to_dict())
    assert verdict.line().startswith(str(verdict.bound))
    rates = {p.name: p.rate_per_hour for p in verdict.projections}
    if rates:  # more of anything never lowers the modelled rate
        assert all(rates[name] >= rates["as-run"] for name in rates)


# --- NVML's figures ----------------------------------------------------------------------------


def test_nvml_figures_are_averaged_and_a_held_down_clock_is_said_in_the_reason() -> None:
    hot = (GpuActivity(0, 0.99, 0.6, ("thermal",)), GpuActivity(1, 0.95, 1.0, ()))
    cool = (GpuActivity(0, 0.97, 1.0, ()), GpuActivity(1, 0.97, 1.0, ()))
    gpu_bound = samples(10, proving=2, states=("synth_done",) * 3 + ("gpu", "gpu"))
    mixed = [dataclasses.replace(s, gpus=hot if i < 4 else cool) for i, s in enumerate(gpu_bound)]
    verdict = judge(mixed, SHAPE)
    assert verdict.bound == Bound.GPU
    evidence = verdict.to_dict()["evidence"]
    assert evidence["gpu_utilisation"] == pytest.approx(0.97)
    assert evidence["slowdown_share"] == pytest.approx(0.4)
    assert evidence["slowdowns"] == ["thermal"]
    assert "NVML utilisation 97 %" in verdict.reason
    assert "clocks held down (thermal) in 40 % of the samples" in verdict.reason
    # Below SLOWED the clocks are not mentioned; without NVML nothing is.
    calm = [dataclasses.replace(s, gpus=cool) for s in gpu_bound]
    assert "held down" not in judge(calm, SHAPE).reason
    plain = judge(gpu_bound, SHAPE)
    assert "NVML" not in plain.reason
    assert plain.to_dict()["evidence"]["gpu_utilisation"] is None
