"""A job of the simulated engine: its record, its times on the engine's clock, its answer.

``Job`` is what one SubmitProof became (a second submission of the same id is another job, as
the real engine does not de-duplicate). ``times`` is what the timeline records of it
(``sim.daemon.timeline``), ``answer`` the ``AwaitProofResponse`` its waiters get: a FAILED result
carries no timing (every field 0, as the real engine's), a completed one its queue wait, SRS
load, synthesis and GPU times and its total from its arrival, with random proof bytes of the
kind's size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.timeline import JobTimes

POREP = pb.POREP_SEAL_COMMIT
Status = pb.AwaitProofResponse.Status


@dataclass(eq=False)
class Job:
    job_id: str
    seq: int
    kind: pb.ProofKind
    submitted_at: float
    payload: bytes = b""
    state: Literal["queued", "running", "done"] = "queued"
    parsed: bool = False
    error: str | None = None
    factor: float = 1.0
    started_at: float | None = None
    synthesis_s: float = 0.0
    gpu_s: float = 0.0
    srs_load_s: float = 0.0
    proved: bool = False
    awaiting_pce: bool = False
    admitted_at: float | None = None  # entered the partition pipeline
    reply_to: int | None = None  # the job whose answer this submission followed
    starved_s: float = 0.0  # idle capacity before it arrived that only the client could fill

    @property
    def queue(self) -> str:
        return model.QUEUE_NAME[self.kind]

    def times(
        self, status: str, end: float | None = None, answered: float | None = None
    ) -> JobTimes:
        """Its times as the timeline records them (simulated seconds on the engine's clock)."""
        return JobTimes(
            seq=self.seq,
            job_id=self.job_id,
            kind=self.queue,
            status=status,
            arrived_s=self.submitted_at,
            admitted_s=self.admitted_at,
            reply_to=self.reply_to,
            started_s=self.started_at,
            completed_s=end,
            answered_s=answered,
            starved_s=self.starved_s,
        )

    def answer(self, error: str | None, end: float) -> pb.AwaitProofResponse:
        """What its waiters get when it ends at ``end`` (failed with ``error``, or completed)."""
        if error:
            # The real engine fills no timing into a FAILED result: every field is 0.
            return pb.AwaitProofResponse(
                job_id=self.job_id, status=Status.FAILED, error_message=error
            )
        queued_until = self.started_at if self.started_at is not None else end
        return pb.AwaitProofResponse(
            job_id=self.job_id,
            status=Status.COMPLETED,
            proof=os.urandom(model.PROOF_BYTES[self.kind]),
            queue_wait_ms=round((queued_until - self.submitted_at) * 1000),
            srs_load_ms=round(self.srs_load_s * 1000),
            synthesis_ms=round(self.synthesis_s * 1000),
            gpu_compute_ms=round(self.gpu_s * 1000),
            total_ms=round((end - self.submitted_at) * 1000),
        )
