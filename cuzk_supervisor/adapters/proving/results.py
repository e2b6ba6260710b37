"""How proofs ended, as values: :class:`ProofResult` (with its :class:`ProofStatus` and the
daemon's own :class:`DaemonTimings`) for one proof, :class:`BatchSummary` and
:class:`BatchResult` for a batch, and the pure :func:`summarize_batch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cuzk_supervisor.core.bench import proofs_per_hour
from cuzk_supervisor.proto import proving_pb2 as pb


class ProofStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    """The daemon ran the proof and reported it FAILED (or CANCELLED): never retried."""
    LOST = "lost"
    """The daemon lost the job again after one resubmission (NOT_FOUND twice)."""
    REJECTED = "rejected"
    """A call failed with a non-transient error (e.g. INVALID_ARGUMENT)."""
    BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True, slots=True)
class DaemonTimings:
    """The daemon's own figures. On the PoRep path synthesis and GPU times are sums over
    partitions (they can exceed wall time): compute rates from wall-clock time."""

    queue_wait_ms: int = 0
    srs_load_ms: int = 0
    synthesis_ms: int = 0
    gpu_compute_ms: int = 0
    total_ms: int = 0

    @classmethod
    def of(cls, response: pb.AwaitProofResponse) -> DaemonTimings:
        """The response's fields of the same names."""
        return cls(**{f.name: getattr(response, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class ProofResult:
    """How one proof ended. ``started_at``/``finished_at`` are ``time.monotonic()`` stamps."""

    job_id: str
    status: ProofStatus
    started_at: float
    finished_at: float
    error: str = ""
    proof: bytes = field(default=b"", repr=False)
    timings: DaemonTimings = DaemonTimings()
    submissions: int = 0
    """SubmitProof calls the daemon saw (refused connections and cut uploads not counted)."""
    await_attempts: int = 0
    """AwaitProof calls made."""
    uploads_cut: int = 0
    """SubmitProof calls cut before they landed (cut, then the job was NOT_FOUND)."""
    landed_at: float | None = None
    """``time.monotonic()`` by which the daemon had accepted the job this result is of: when
    its SubmitProof answered or, where that answer was lost and the job then found, when the
    submit attempt that carried it ended; None when neither was seen."""
    sent_at: float | None = None
    """``time.monotonic()`` when the submit attempt that carried the job began (None with
    ``landed_at``): the daemon had it between this and ``landed_at``."""

    @property
    def ok(self) -> bool:
        return self.status is ProofStatus.COMPLETED

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def proof_len(self) -> int:
        return len(self.proof)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the proof itself left out, its length kept)."""
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "status": str(self.status),
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "proof_len": self.proof_len,
            "submissions": self.submissions,
            "uploads_cut": self.uploads_cut,
            "await_attempts": self.await_attempts,
            **dataclasses.asdict(self.timings),
        }


@dataclass(frozen=True, slots=True)
class BatchSummary:
    count: int
    concurrency: int
    completed: int
    failed: int
    wall_s: float
    """From the first proof's submit to the last proof's end (completed or failed)."""
    proofs_per_hour: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "concurrency": self.concurrency,
            "completed": self.completed,
            "failed": self.failed,
            "wall_s": round(self.wall_s, 3),
            "proofs_per_hour": round(self.proofs_per_hour, 3),
        }


@dataclass(frozen=True, slots=True)
class BatchResult:
    results: tuple[ProofResult, ...]
    """In submission order (index i is the i-th proof started)."""
    summary: BatchSummary


def summarize_batch(results: Sequence[ProofResult], concurrency: int) -> BatchSummary:
    """Pure: counts and rate of a finished batch."""
    completed = sum(1 for r in results if r.ok)
    wall = (
        max(r.finished_at for r in results) - min(r.started_at for r in results) if results else 0.0
    )
    return BatchSummary(
        count=len(results),
        concurrency=concurrency,
        completed=completed,
        failed=len(results) - completed,
        wall_s=wall,
        proofs_per_hour=proofs_per_hour(completed, wall),
    )
