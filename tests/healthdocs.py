"""Status documents in the real daemon's shape (``cuzk-core/src/status.rs``, ``StatusSnapshot``)
for the health policy's tests: what the daemon answers on ``GET /status`` in the situations the
policy judges, quirks included (live ``gpu_ms``, ``busy_secs`` since the pickup, a failed job
never completed and left listed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GIB = 1 << 30


def partition(index: int, state: str, synth_ms: int | None = None,
              gpu_ms: int | None = None) -> dict[str, Any]:  # fmt: skip
    return {"index": index, "state": state, "synth_ms": synth_ms, "gpu_ms": gpu_ms}


def pipeline(job_id: str, partitions: Sequence[dict[str, Any]],
             started_secs_ago: float = 60.0) -> dict[str, Any]:  # fmt: skip
    return {
        "job_id": job_id,
        "proof_kind": "PoRep",
        "started_secs_ago": started_secs_ago,
        "total_partitions": len(partitions),
        "partitions_done": sum(1 for p in partitions if p["state"] == "done"),
        "partitions": list(partitions),
    }


def worker(worker_id: int, gpu: int, job: str | None = None, part: int | None = None,
           busy_secs: float | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "worker_id": worker_id,
        "gpu_ordinal": gpu,
        "state": "proving" if job is not None else "idle",
        "current_job": job,
        "current_partition": part,
        "busy_secs": busy_secs,
    }


def document(
    *,
    uptime: float = 3600.0,
    completed: int = 0,
    failed: int = 0,
    pipelines: Sequence[dict[str, Any]] = (),
    workers: Sequence[dict[str, Any]] | None = None,
    active: int = 0,
) -> dict[str, Any]:
    """One ``/status`` answer; two idle workers on GPU 0 unless ``workers`` says otherwise."""
    return {
        "uptime_secs": uptime,
        "memory": {"total_bytes": 238 * GIB, "used_bytes": 70 * GIB, "available_bytes": 168 * GIB},
        "synthesis": {"max_concurrent": 26, "active": active},
        "pipelines": list(pipelines),
        "gpu_workers": list(workers if workers is not None else (worker(0, 0), worker(1, 0))),
        "allocations": {"srs": [], "pce": []},
        "counters": {
            "total_completed": completed,
            "total_failed": failed,
            "completed_by_kind": {"PoRep": completed} if completed else {},
            "failed_by_kind": {"PoRep": failed} if failed else {},
            "queue_depth": 0,
        },
        "buffers": {
            "synth_in_flight": active,
            "provers_in_flight": 0,
            "aux_in_flight": 0,
            "shells_in_flight": 0,
            "pending_handles": 0,
        },
    }


def proving(job: str, *, done: int = 4, in_gpu: int = 1, gpu_ms: int = 3000) -> dict[str, Any]:
    """A job half-way: ``done`` partitions proved, ``in_gpu`` in the GPU stage, the rest
    synthesizing."""
    parts = [partition(i, "done", 30_000, 3_100) for i in range(done)]
    parts += [partition(done + i, "gpu", 30_000, gpu_ms) for i in range(in_gpu)]
    parts += [partition(i, "synthesizing", 12_000) for i in range(done + in_gpu, 10)]
    return pipeline(job, parts)
