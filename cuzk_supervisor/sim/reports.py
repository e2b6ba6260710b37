"""What the daemon reports about itself: GetStatus, GetMetrics text and the ``/status`` JSON.

Every duration the daemon reports (uptime, ``*_ms``) is simulated time, as the daemon
"lives" in it; rates measured by a client come from its own wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim import model
from cuzk_supervisor.sim.engine import Engine, Job
from cuzk_supervisor.sim.machine import GPU_NAME

# The real daemon's label values for proof kinds in its metrics (underscores, not queue names).
METRIC_KIND = {name: name.replace("-", "_") for name in model.QUEUE_NAME.values()}
# The bench runs at concurrency 2 (reference/incidents.md I3); other values are labelled.
REFERENCE_CONCURRENCY = 2


def _gpu_busy(engine: Engine) -> bool:
    return any(job.state == "running" for job in engine.live_jobs())


def _vram_used(engine: Engine) -> int:
    if not _gpu_busy(engine):
        return 0
    return min(model.gib_bytes(model.GPU_VRAM_PROVING_GIB), engine.vram_bytes)


def steady_state(engine: Engine, concurrency: int = REFERENCE_CONCURRENCY) -> float:
    rate = model.steady_state_proofs_per_hour(
        engine.slots,
        concurrency,
        engine.gpu_workers,
        synthesis_factor=engine.synthesis_slowdown,
        gpu_factor=engine.gpu_factor,
    )
    return round(rate, 3)


def _gpu_worker_job(engine: Engine, worker: int) -> Job | None:
    slot = engine.pipeline.gpu[worker] if worker < len(engine.pipeline.gpu) else None
    return engine.job_by_seq(slot[0].seq) if slot is not None else None


def get_status(engine: Engine) -> pb.GetStatusResponse:
    live = engine.live_jobs()
    gpus = []
    for worker in range(engine.gpu_workers):
        job = _gpu_worker_job(engine, worker)
        total = engine.vram_bytes
        gpus.append(
            pb.GPUStatus(
                ordinal=worker // max(1, engine.gpu_workers_per_device),
                name=GPU_NAME,
                vram_total_bytes=total,
                vram_free_bytes=total - _vram_used(engine),
                current_job_id=job.job_id if job else "",
                current_proof_kind=job.queue if job else "",
            )
        )
    # The real service fills neither size_bytes nor ref_count (both 0).
    srs = [
        pb.SRSStatus(circuit_id=circuit, tier=pb.SRSStatus.HOT)
        for circuit in engine.resident.srs
        if engine.resident.loaded(circuit)
    ]
    # Only kinds with jobs still in the engine (queued or running) are listed: none when idle.
    queues = []
    for name in model.QUEUE_NAME.values():
        pending = sum(1 for j in live if j.queue == name and j.state == "queued")
        running = sum(1 for j in live if j.queue == name and j.state == "running")
        if pending or running:
            queues.append(pb.QueueStatus(proof_kind=name, pending=pending, in_progress=running))
    # pinned_memory_bytes and pinned_memory_limit_bytes are never filled in: 0 (the real
    # figures are in GET /status).
    return pb.GetStatusResponse(
        gpus=gpus,
        loaded_srs=srs,
        queues=queues,
        total_proofs_completed=engine.completed_total,
        total_proofs_failed=engine.failed_total,
        uptime_seconds=int(engine.now()),
    )


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Integers exactly (byte counts must not lose digits), other values to 3 decimals."""
    return str(int(value)) if float(value).is_integer() else repr(round(value, 3))


def metrics_text(engine: Engine, deadline_cuts: Mapping[str, int] | None = None) -> str:
    live = engine.live_jobs()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

    metric(
        "cuzk_proofs_completed_total",
        "counter",
        "Proofs completed.",
        [("", engine.completed_total)],
    )
    metric("cuzk_proofs_failed_total", "counter", "Proofs failed.", [("", engine.failed_total)])
    metric("cuzk_uptime_seconds", "gauge", "Seconds since start.", [("", int(engine.now()))])
    queued = sum(1 for j in live if j.state == "queued")
    metric("cuzk_queue_depth", "gauge", "Jobs waiting to start.", [("", queued)])
    metric("cuzk_running_jobs", "gauge", "Jobs in progress.", [("", len(live) - queued)])
    metric("cuzk_gpu_workers", "gauge", "GPU workers.", [("", engine.gpu_workers)])
    kinds = list(model.QUEUE_NAME.values())

    def by_kind(values: Mapping[str, float]) -> list[tuple[str, float]]:
        return [(f'{{proof_kind="{METRIC_KIND[k]}"}}', values[k]) for k in kinds]

    metric("cuzk_proofs_completed", "counter", "Proofs completed, by kind.",
           by_kind(engine.completed))  # fmt: skip
    metric("cuzk_proofs_failed", "counter", "Proofs failed, by kind.", by_kind(engine.failed))
    lines.append("# HELP cuzk_proof_duration_seconds Time of finished proofs, by kind.")
    lines.append("# TYPE cuzk_proof_duration_seconds summary")
    for k in kinds:
        label = f'{{proof_kind="{METRIC_KIND[k]}"}}'
        count = engine.completed[k] + engine.failed[k]
        lines.append(f"cuzk_proof_duration_seconds_count{label} {count}")
        lines.append(f"cuzk_proof_duration_seconds_sum{label} {_number(engine.duration_s[k])}")
    metric(
        "cuzk_sim_submissions_total",
        "counter",
        "SubmitProof/Prove calls per request id.",
        [(f'{{request_id="{_label(rid)}"}}', n) for rid, n in engine.submissions.items()],
    )
    metric(
        "cuzk_sim_deadline_cuts_total",
        "counter",
        "Calls ended at their grpc-timeout, by call: cut by the server-side deadline (answered"
        ' CANCELLED "Timeout expired") or cancelled by the client\'s own timer just before it.',
        [(f'{{call="{call}"}}', n) for call, n in sorted((deadline_cuts or {}).items())],
    )
    metric(
        "cuzk_sim_steady_state_proofs_per_hour",
        "gauge",
        f"Model's long-run PoRep rate at concurrency {REFERENCE_CONCURRENCY}.",
        [("", steady_state(engine))],
    )
    metric(
        "cuzk_sim_steady_state_proofs_per_hour_by_concurrency",
        "gauge",
        "Model's long-run PoRep rate by client concurrency.",
        [(f'{{concurrency="{c}"}}', steady_state(engine, c)) for c in range(1, 5)],
    )
    metric(
        "cuzk_sim_rss_simulated_bytes",
        "gauge",
        "Simulated resident memory.",
        [("", engine.memory.simulated_bytes)],
    )
    metric(
        "cuzk_sim_rss_pending_changes",
        "gauge",
        "Partition memory mappings and unmappings queued for the page thread: until 0, the real"
        " RSS lags the simulated figure (more so on a loaded machine).",
        [("", engine.memory.pending_changes)],
    )
    return "\n".join(lines) + "\n"


def _gpu_workers_status(engine: Engine) -> list[dict[str, Any]]:
    """``gpu_workers[]``: each worker idle or proving, with its cumulative busy seconds."""
    now = engine.now()
    gpu_seconds = model.GPU_SECONDS_PER_PARTITION * engine.gpu_factor
    workers = []
    for worker in range(engine.gpu_workers):
        slot = engine.pipeline.gpu[worker] if worker < len(engine.pipeline.gpu) else None
        busy = engine.gpu_busy_s[worker] if worker < len(engine.gpu_busy_s) else 0.0
        job = None
        if slot is not None:
            job = engine.job_by_seq(slot[0].seq)
            busy += min(gpu_seconds, max(0.0, now - (slot[1] - gpu_seconds)))
        workers.append(
            {
                "worker_id": worker,
                "gpu_ordinal": worker // max(1, engine.gpu_workers_per_device),
                "state": "proving" if slot is not None else "idle",
                "current_job": job.job_id if job else None,
                "current_partition": slot[0].index if slot is not None else None,
                "busy_secs": round(busy, 3),
            }
        )
    return workers


def _pipeline_status(engine: Engine, job: Job, now: float) -> dict[str, Any]:
    parts = job.partitions
    return {
        "job_id": job.job_id,
        "proof_kind": job.queue,
        "started_secs_ago": round(max(0.0, now - job.submitted_at), 3),
        "total_partitions": len(parts),
        "partitions_done": sum(1 for state in parts if state == "done"),
        "partitions": [
            {
                "index": i,
                "state": state,
                "synth_ms": job.synth_ms[i] if i < len(job.synth_ms) else None,
                "gpu_ms": job.gpu_ms[i] if i < len(job.gpu_ms) else None,
            }
            for i, state in enumerate(parts)
        ],
    }


def _allocations(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """``allocations{srs[], pce[]}`` (``circuit_id, bytes, last_used_secs_ago, evictable``)."""
    resident = engine.resident
    srs = [
        {
            "circuit_id": circuit,
            "bytes": model.gib_bytes(model.SRS_GIB[circuit]),
            "last_used_secs_ago": 0,
            "evictable": False,
        }
        for circuit in resident.srs
        if resident.loaded(circuit)
    ]
    pce = []
    if resident.pce == "ready":
        pce.append(
            {
                "circuit_id": "porep-32g",
                "bytes": model.gib_bytes(model.PCE_GIB),
                "last_used_secs_ago": 0,
                "evictable": False,
            }
        )
    return {"srs": srs, "pce": pce}


def status_document(
    engine: Engine, *, memory_scale: float, gpu_faults: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """``GET /status``: the real daemon's JSON (``reference/cuzk.md``, "Optional HTTP status
    listener") plus a ``sim`` object."""
    live = engine.live_jobs()
    now = engine.now()
    used = engine.memory.simulated_bytes
    synthesizing = len(engine.pipeline.synthesizing)
    gpu_busy = sum(1 for slot in engine.pipeline.gpu if slot is not None)
    return {
        "uptime_secs": int(now),
        "memory": {
            "total_bytes": engine.total_budget_bytes,
            "used_bytes": used,
            "available_bytes": max(0, engine.total_budget_bytes - used),
        },
        "synthesis": {
            "max_concurrent": engine.slots,
            "active": synthesizing,
        },
        "pipelines": [_pipeline_status(engine, job, now) for job in live],
        "gpu_workers": _gpu_workers_status(engine),
        "counters": {
            "total_completed": engine.completed_total,
            "total_failed": engine.failed_total,
            "completed_by_kind": dict(engine.completed),
            "failed_by_kind": dict(engine.failed),
            "queue_depth": sum(1 for j in live if j.state == "queued"),
            "running": sum(1 for j in live if j.state == "running"),
        },
        "allocations": _allocations(engine),
        "buffers": {
            "synth_in_flight": synthesizing,
            "provers_in_flight": gpu_busy,
            "aux_in_flight": 0,
            "shells_in_flight": 0,
            "pending_handles": len(engine.pipeline.gpu_queue),
        },
        "sim": {
            "rss_simulated_bytes": used,
            "rss_pending_changes": engine.memory.pending_changes,
            "submissions": dict(engine.submissions),
            "steady_state_proofs_per_hour": steady_state(engine),
            "steady_state_proofs_per_hour_by_concurrency": {
                str(c): steady_state(engine, c) for c in range(1, 5)
            },
            "time_scale": engine.time_scale,
            "memory_scale": memory_scale,
            "release": engine.release,
            "synthesis_slots": engine.slots,
            "synthesis_factor": engine.synthesis_factor,
            "gpu_factor": engine.gpu_factor,
            "cpu_share": engine.cpu_share,
            # The machine's CPU busy share now (the model's; None without --cpu-share).
            "cpu_busy_share": (
                None
                if engine.cpu_share is None
                else round(model.cpu_busy_share(synthesizing, engine.slots, engine.cpu_share), 3)
            ),
            "pce": engine.resident.pce,
            "workers_stopped": engine.stopped,
            "gpus": [
                {
                    "index": gpu,
                    "name": GPU_NAME,
                    "vram_total_bytes": engine.vram_bytes,
                    "vram_used_bytes": _vram_used(engine),
                    **({"fault": gpu_faults[gpu]} if gpu_faults and gpu in gpu_faults else {}),
                }
                for gpu in range(engine.gpus)
            ],
        },
    }
