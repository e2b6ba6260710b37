"""The pure partition pipeline: FIFO across jobs, shared `active`, GPU overlap, abort, freeze."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim import model
from cuzk_supervisor.sim.pipeline import (
    GpuStarted,
    JobProved,
    JobSynthesized,
    Part,
    Pipeline,
    Started,
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
    assert proved.at == pytest.approx(5 * 30.4 + model.GPU_SECONDS_PER_PARTITION)


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


def test_abort_frees_slots_and_forgets_the_job() -> None:
    pipe = Pipeline(slots=2, gpu_workers=2)
    pipe.submit(0, 0.0)
    pipe.submit(1, 0.0)
    dropped = pipe.abort(0, 1.0)
    assert dropped == [Part(0, 0), Part(0, 1)]
    restarted = [e for e in pipe.refill(1.0) if isinstance(e, Started)]
    assert [e.part for e in restarted] == [Part(1, 0), Part(1, 1)]
    assert all(e.at == 1.0 for e in restarted)
    proved = [e.seq for e in run_until_idle(pipe) if isinstance(e, JobProved)]
    assert proved == [1]


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
