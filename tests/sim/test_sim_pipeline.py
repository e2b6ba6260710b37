"""The pure partition pipeline: priority order across jobs, processor sharing, the GPU stage's
steps and turns, a failed synthesis handled as engine.rs does, freeze."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.pipeline import (
    CudaFinished,
    CudaStarted,
    GpuFinished,
    GpuSkipped,
    GpuStarted,
    GpuTimes,
    JobProved,
    JobSynthesized,
    Part,
    Pipeline,
    Started,
    SynthesisFailed,
    Synthesized,
)


def run_until_idle(pipe: Pipeline) -> list:
    events = []
    while (t := pipe.next_deadline()) is not None:
        events += pipe.advance(t)
    return events


def test_partitions_start_in_submission_order_across_jobs() -> None:
    pipe = Pipeline(slots=3, gpu_workers=2)
    events = pipe.submit(0, 0.0) + pipe.submit(1, 0.0) + run_until_idle(pipe)
    order = [e.part for e in events if isinstance(e, Started)]
    assert order == [Part(0, i) for i in range(10)] + [Part(1, i) for i in range(10)]


def test_a_batch_started_together_shares_the_active_count() -> None:
    pipe = Pipeline(slots=10, gpu_workers=2)
    started = [e for e in pipe.submit(0, 0.0) if isinstance(e, Started)]
    assert {e.active for e in started} == {10}
    assert {e.seconds for e in started} == {model.partition_seconds(10)}


def test_one_proof_at_two_workers_takes_five_rounds_plus_the_gpu_tail() -> None:
    pipe = Pipeline(slots=2, gpu_workers=2)
    events = pipe.submit(0, 0.0) + run_until_idle(pipe)
    synthesized = next(e for e in events if isinstance(e, JobSynthesized))
    proved = next(e for e in events if isinstance(e, JobProved))
    assert synthesized.at == pytest.approx(5 * 30.4)
    # The last pair: both prepare (0.5 s), one GPU proves them in turn (3 s each), the second
    # one's finalization (0.5 s) ends the proof.
    assert proved.at == pytest.approx(5 * 30.4 + 0.5 + 3.0 + 3.0 + 0.5)


def test_a_partition_speeds_up_when_the_others_end() -> None:
    # Two jobs at 2 slots with made-up sharing: alone 10 s, two at once 20 s each.
    pipe = Pipeline(slots=2, gpu_workers=2, partition_seconds=lambda n: 10.0 * n,
                    factor=lambda seq: 0.5 if seq == 0 else 1.0)  # fmt: skip
    pipe.submit(0, 0.0, partitions=1)
    events = pipe.submit(1, 0.0, partitions=1) + run_until_idle(pipe)
    ends = {e.part.seq: e.at for e in events if isinstance(e, Synthesized)}
    # Job 0's half-size partition ends at 10 s (half its work at 20 s each); job 1 has half its
    # work left then, and alone it does that in 5 s.
    assert ends == pytest.approx({0: 10.0, 1: 15.0})


def test_the_workers_of_one_gpu_take_turns_and_finalize_after_moving_on() -> None:
    pipe = Pipeline(slots=2, gpu_workers=2, partition_seconds=lambda n: 10.0,
                    gpu=GpuTimes(prep=1.0, cuda=4.0, finalize=2.0))  # fmt: skip
    events = pipe.submit(0, 0.0, partitions=2) + run_until_idle(pipe)
    cuda = [(type(e).__name__, e.worker, e.at) for e in events
            if isinstance(e, CudaStarted | CudaFinished)]  # fmt: skip
    # Both picked up at 10 s and prepared by 11 s; worker 0 gets the GPU, worker 1 waits.
    assert cuda == [("CudaStarted", 0, 11.0), ("CudaFinished", 0, 15.0),
                    ("CudaStarted", 1, 15.0), ("CudaFinished", 1, 19.0)]  # fmt: skip
    finished = {e.worker: (e.at, e.seconds) for e in events if isinstance(e, GpuFinished)}
    # gpu_ms spans the pickup to the finalizer's end: preparation, the wait, CUDA, finalization.
    assert finished == {0: (17.0, 7.0), 1: (21.0, 11.0)}


def test_two_gpus_prove_at_once() -> None:
    pipe = Pipeline(slots=2, gpu_workers=4, partition_seconds=lambda n: 10.0)
    events = pipe.submit(0, 0.0, partitions=2) + run_until_idle(pipe)
    starts = [(e.worker, e.at) for e in events if isinstance(e, CudaStarted)]
    assert starts == [(0, 10.5), (1, 13.5)]  # one GPU, workers 0 and 1 first (worker order)
    pipe = Pipeline(slots=2, gpu_workers=4, partition_seconds=lambda n: 10.0,
                    workers_per_device=1)  # fmt: skip
    events = pipe.submit(0, 0.0, partitions=2) + run_until_idle(pipe)
    assert [(e.worker, e.at) for e in events if isinstance(e, CudaStarted)] == [
        (0, 10.5),
        (1, 10.5),
    ]


def test_gpu_work_overlaps_later_synthesis() -> None:
    pipe = Pipeline(slots=2, gpu_workers=1)
    events = pipe.submit(0, 0.0) + run_until_idle(pipe)
    first_gpu = next(e for e in events if isinstance(e, GpuStarted))
    third_start = [e for e in events if isinstance(e, Started)][2]
    assert first_gpu.at == third_start.at == pytest.approx(30.4)


def test_job_factor_scales_its_partitions() -> None:
    pipe = Pipeline(slots=2, gpu_workers=2, factor=lambda seq: 1.25 if seq == 0 else 1.0)
    events = pipe.submit(0, 0.0) + run_until_idle(pipe)
    assert {e.seconds for e in events if isinstance(e, Started)} == {30.4 * 1.25}


def test_a_failed_synthesis_fails_its_job_as_the_real_engine_does() -> None:
    """Partition 3 of job 0 fails as it starts: its slot frees at once, job 0's waiting
    partitions are skipped, the ones synthesizing run to their end and the GPU worker that picks
    them up leaves them at once; job 0 is never proved, job 1 is."""
    pipe = Pipeline(slots=4, gpu_workers=2, partition_seconds=lambda n: 10.0,
                    fails=lambda part: part == Part(0, 3))  # fmt: skip
    events = pipe.submit(0, 0.0) + pipe.submit(1, 0.0) + run_until_idle(pipe)
    assert [(e.part, e.at) for e in events if isinstance(e, SynthesisFailed)] == [(Part(0, 3), 0)]
    started = [e.part for e in events if isinstance(e, Started) and e.at == 0.0]
    assert started == [Part(0, 0), Part(0, 1), Part(0, 2), Part(0, 3), Part(1, 0)]
    assert not [e for e in events if isinstance(e, Started) and e.part.seq == 0 and e.at > 0]
    skipped = [e.part for e in events if isinstance(e, GpuSkipped)]
    assert skipped == [Part(0, 0), Part(0, 1), Part(0, 2)]
    assert not [e for e in events if isinstance(e, GpuFinished) and e.part.seq == 0]
    assert [e.seq for e in events if isinstance(e, JobProved)] == [1]
    assert [e.seq for e in events if isinstance(e, JobSynthesized)] == [1]


def test_freeze_stops_all_progress() -> None:
    pipe = Pipeline(slots=2, gpu_workers=2)
    pipe.submit(0, 0.0)
    pipe.freeze()
    assert pipe.next_deadline() is None
    assert pipe.advance(10_000.0) == []
    assert len(pipe.synthesizing) == 2


def test_late_advance_processes_events_at_their_own_times() -> None:
    # A deadline handled late (loop lag) must not shift later work: no drift.
    pipe = Pipeline(slots=2, gpu_workers=2)
    pipe.submit(0, 0.0)
    events = pipe.advance(100.0)  # first round ended at 30.4, second at 60.8, third at 91.2
    starts = sorted({e.at for e in events if isinstance(e, Started)})
    assert starts == pytest.approx([30.4, 60.8, 91.2])
    assert max(e.at for e in events) <= 100.0
    assert [e.at for e in events if isinstance(e, Synthesized)] == pytest.approx(
        [30.4] * 2 + [60.8] * 2 + [91.2] * 2
    )
