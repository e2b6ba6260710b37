"""The real daemon's status tracker (``cuzk-core/src/status.rs``), method for method.

The engine calls it where engine.rs calls ``StatusTracker`` (``sim.daemon.engine``): a job is
registered when it enters the pipeline, a partition's synthesis start and end, its GPU pickup
and the finalizer's end, a failed synthesis, a job completed. :meth:`StatusTracker.snapshot`
computes each field of ``GET /status`` as status.rs does, quirks included (docs/simulator.md,
"Inspection": ``synthesis.active`` leaking upward after a failed synthesis, live ``synth_ms``
and ``gpu_ms``, a failed job listed for the daemon's life, a completed one dropped at the first
snapshot 30 whole seconds after); ``started_secs_ago`` counts from the registration, not the
submission, and ``partitions_done`` counts ``done`` partitions.

Times are the engine's simulated seconds; Rust's ``as_millis() as u64`` truncates, so do we.
The pipelines come out in registration order (status.rs iterates a HashMap: any order).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KEEP_COMPLETED_S = 30
"""status.rs: ``now.duration_since(t).as_secs() < 30`` keeps a completed job."""


def _ms(start: float | None, end: float | None, now: float) -> int | None:
    if start is None:
        return None
    return math.floor(max(0.0, (now if end is None else end) - start) * 1000)


@dataclass(slots=True)
class _Partition:
    phase: str = "pending"
    synth_start: float | None = None
    synth_end: float | None = None
    gpu_start: float | None = None
    gpu_end: float | None = None


@dataclass(slots=True)
class _Job:
    proof_kind: str
    started_at: float
    partitions: list[_Partition]
    completed_at: float | None = None


@dataclass(slots=True)
class _Worker:
    worker_id: int
    gpu_ordinal: int
    busy: bool = False
    current_job: str | None = None
    current_partition: int | None = None
    busy_since: float | None = None


@dataclass(slots=True)
class StatusTracker:
    started_at: float = 0.0
    jobs: dict[str, _Job] = field(default_factory=dict)
    workers: list[_Worker] = field(default_factory=list)
    synth_active: int = 0
    completed_by_kind: Counter[str] = field(default_factory=Counter)
    failed_by_kind: Counter[str] = field(default_factory=Counter)
    queue_depth: int = 0

    def register_workers(self, workers: list[tuple[int, int]]) -> None:
        """``(worker_id, gpu_ordinal)`` of every GPU worker, at the engine's start."""
        self.workers = [_Worker(worker_id, ordinal) for worker_id, ordinal in workers]

    def register_job(self, job_id: str, proof_kind: str, partitions: int, now: float) -> None:
        # HashMap::insert: a second job under the same id replaces the first one's record.
        self.jobs[job_id] = _Job(proof_kind, now, [_Partition() for _ in range(partitions)])

    def _part(self, job_id: str, index: int) -> _Partition | None:
        job = self.jobs.get(job_id)
        return job.partitions[index] if job is not None and index < len(job.partitions) else None

    def partition_synth_start(self, job_id: str, index: int, now: float) -> None:
        self.synth_active += 1
        if (p := self._part(job_id, index)) is not None:
            p.phase, p.synth_start = "synthesizing", now

    def partition_synth_end(self, job_id: str, index: int, now: float) -> None:
        self.synth_active = max(0, self.synth_active - 1)
        if (p := self._part(job_id, index)) is not None:
            p.phase, p.synth_end = "synth_done", now

    def partition_gpu_start(self, job_id: str, index: int, worker_id: int, now: float) -> None:
        if (p := self._part(job_id, index)) is not None:
            p.phase, p.gpu_start = "gpu", now
        for w in self.workers:
            if w.worker_id == worker_id:
                w.busy, w.current_job, w.current_partition, w.busy_since = True, job_id, index, now
                break

    def partition_gpu_end(self, job_id: str, index: int, worker_id: int, now: float) -> None:
        if (p := self._part(job_id, index)) is not None:
            p.phase, p.gpu_end = "done", now
        for w in self.workers:
            if w.worker_id == worker_id:
                if w.current_job == job_id and w.current_partition == index:  # still_mine
                    w.busy, w.current_job, w.current_partition, w.busy_since = (
                        False, None, None, None,
                    )  # fmt: skip
                break

    def partition_failed(self, job_id: str, index: int) -> None:
        """No timestamp, no change to ``synth_active``: the +1 of its start stays."""
        if (p := self._part(job_id, index)) is not None:
            p.phase = "failed"

    def job_completed(self, job_id: str, proof_kind: str, success: bool, now: float) -> None:
        (self.completed_by_kind if success else self.failed_by_kind)[proof_kind] += 1
        if (job := self.jobs.get(job_id)) is not None:
            job.completed_at = now

    def snapshot(self, now: float) -> dict[str, Any]:
        """status.rs's ``snapshot`` without the parts the tracker does not own (``memory``,
        ``allocations``, ``buffers``: the caller's); drops jobs completed 30 s ago or more."""
        self.jobs = {
            job_id: job
            for job_id, job in self.jobs.items()
            if job.completed_at is None or math.floor(now - job.completed_at) < KEEP_COMPLETED_S
        }
        pipelines = [
            {
                "job_id": job_id,
                "proof_kind": job.proof_kind,
                "started_secs_ago": max(0.0, now - job.started_at),
                "total_partitions": len(job.partitions),
                "partitions_done": sum(1 for p in job.partitions if p.phase == "done"),
                "partitions": [
                    {
                        "index": i,
                        "state": p.phase,
                        "synth_ms": _ms(p.synth_start, p.synth_end, now),
                        "gpu_ms": _ms(p.gpu_start, p.gpu_end, now),
                    }
                    for i, p in enumerate(job.partitions)
                ],
            }
            for job_id, job in self.jobs.items()
        ]
        workers = [
            {
                "worker_id": w.worker_id,
                "gpu_ordinal": w.gpu_ordinal,
                "state": "proving" if w.busy else "idle",
                "current_job": w.current_job,
                "current_partition": w.current_partition,
                "busy_secs": None if w.busy_since is None else max(0.0, now - w.busy_since),
            }
            for w in self.workers
        ]
        return {
            "uptime_secs": max(0.0, now - self.started_at),
            "pipelines": pipelines,
            "gpu_workers": workers,
            "synth_active": self.synth_active,
            "counters": {
                "total_completed": sum(self.completed_by_kind.values()),
                "total_failed": sum(self.failed_by_kind.values()),
                "completed_by_kind": dict(self.completed_by_kind),
                "failed_by_kind": dict(self.failed_by_kind),
                "queue_depth": self.queue_depth,
            },
        }
