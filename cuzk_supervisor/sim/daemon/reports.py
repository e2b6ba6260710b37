"""What the daemon reports about itself: GetStatus and the GetMetrics text (the ``/status`` JSON
is ``sim.daemon.statusdoc``'s).

Every duration the daemon reports (uptime, ``*_ms``) is simulated time, as the daemon
"lives" in it; rates measured by a client come from its own wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.engine import Engine
from cuzk_supervisor.sim.daemon.job import Job
from cuzk_supervisor.sim.daemon.statusdoc import REFERENCE_CONCURRENCY, steady_state, vram_used
from cuzk_supervisor.sim.machine import GPU_NAME

# The real daemon's label values for proof kinds in its metrics (underscores, not queue names).
METRIC_KIND = {name: name.replace("-", "_") for name in model.QUEUE_NAME.values()}


def _gpu_worker_job(engine: Engine, worker: int) -> Job | None:
    workers = engine.pipeline.workers
    part = workers[worker].part if worker < len(workers) else None
    return engine.job_by_seq(part.seq) if part is not None else None


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
                vram_free_bytes=total - vram_used(engine),
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
