"""When the bench counts a proof done (``StretchRun.completed_at``): the daemon's own wall time
for the job from when the submit that carried it began, never later than when we heard of it."""

from __future__ import annotations

import pytest

from cuzk_supervisor.adapters.proving.results import DaemonTimings, ProofResult, ProofStatus
from cuzk_supervisor.core.bench import BenchPolicy
from cuzk_supervisor.lifecycle.benchrun import StretchRun


def run(scale: float = 1.0) -> StretchRun:
    return StretchRun(BenchPolicy(max_proofs=4), 2, lambda: 1e9, clock=lambda: 0.0,
                      daemon_seconds_per_second=scale)  # fmt: skip


def proof(total_ms: int, sent: float | None, landed: float | None, finished: float) -> ProofResult:
    return ProofResult(job_id="j", status=ProofStatus.COMPLETED, started_at=0.0,
                       finished_at=finished, timings=DaemonTimings(total_ms=total_ms),
                       landed_at=landed, sent_at=sent)  # fmt: skip


def test_a_late_read_answer_does_not_move_the_completion():
    """The submit went out at 10.0 s; its answer was read 0.9 s late (a loop busy with a
    daemon's flood of lines): the proof took the daemon 50 s, so it was done at 60.0 s, not at
    60.9 s."""
    assert run().completed_at(proof(50_000, sent=10.0, landed=10.9, finished=61.5)) == 60.0


def test_the_daemons_time_is_scaled_and_never_after_we_heard_of_it():
    assert run(scale=100).completed_at(proof(500_000, 1.0, 1.1, 9.0)) == pytest.approx(6.0)
    assert run().completed_at(proof(50_000, 10.0, 10.1, 55.0)) == 55.0


def test_without_the_submits_start_or_the_daemons_time_it_is_when_we_heard():
    assert run().completed_at(proof(50_000, None, 10.5, 70.0)) == 60.5
    assert run().completed_at(proof(0, 10.0, 10.5, 70.0)) == 70.0
    assert run().completed_at(proof(50_000, None, None, 70.0)) == 70.0
