"""``GET /status``: the real daemon's JSON (``cuzk-core/src/status.rs``, engine.rs's
``detailed_status``; ``docs/daemon.md``, "Optional HTTP status listener") plus a ``sim`` object.

Each field as the daemon computes it: the tracker's (``sim.daemon.statustrack``) for the pipelines,
the GPU workers, ``synthesis.active`` and the counters; ``synthesis.max_concurrent`` is the memory
budget's total over 9 GiB (``SNAP_PARTITION_FULL_BYTES``: an upper bound over proof kinds, not
the partition limiter); ``memory`` is the budget's (``memory.rs``: what its reservations hold:
the resident SRS and PCE, 14 GiB for each PoRep partition from its dispatch to the release of its
a/b/c vectors when its CUDA work ends, 1 GiB from then until its finalizer ends);
``counters.queue_depth`` is the scheduler's queue (jobs not yet taken by the dispatcher, which
takes the next one while the one before loads its SRS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.engine import Engine
from cuzk_supervisor.sim.daemon.pipeline import RESERVED_GIB
from cuzk_supervisor.sim.machine import GPU_NAME

GIB = model.GIB
SNAP_PARTITION_FULL_BYTES = 9 * GIB
"""memory.rs: the smallest partition of any kind (SnapDeals), the divisor of ``max_concurrent``."""
POREP_PARTITION_FULL_GIB = RESERVED_GIB
REFERENCE_CONCURRENCY = 2
"""The bench runs at concurrency 2 (docs/incidents.md I3); other values are labelled."""


def steady_state(engine: Engine, concurrency: int = REFERENCE_CONCURRENCY) -> float:
    """The model's long-run rate of this daemon's plan (``model.steady_state_proofs_per_hour``)."""
    rate = model.steady_state_proofs_per_hour(
        engine.slots,
        concurrency,
        engine.gpu_workers,
        synthesis_factor=engine.synthesis_factor,
        gpu_factor=engine.gpu_factor,
        workers_per_device=engine.gpu_workers_per_device,
        gpu_cpu_factor=engine.gpu_cpu_factor,
        cpu_share=engine.cpu_share,
    )
    return round(rate, 3)


def budget_used_bytes(engine: Engine) -> int:
    """What the memory budget's reservations hold now (module docstring)."""
    held = engine.pipeline.held() * POREP_PARTITION_FULL_GIB
    return round((engine.resident.pinned_gib + held) * GIB)


def queue_depth(engine: Engine) -> int:
    waiting = sum(1 for j in engine.live_jobs() if j.state == "queued" and j.admitted_at is None)
    return max(0, waiting - 1)


def _allocations(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """``allocations{srs[], pce[]}`` (``circuit_id, bytes, last_used_secs_ago, evictable``)."""
    resident = engine.resident
    srs = [
        {
            "circuit_id": circuit,
            "bytes": model.gib_bytes(model.SRS_GIB[circuit]),
            "last_used_secs_ago": 0.0,
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
                "last_used_secs_ago": 0.0,
                "evictable": False,
            }
        )
    return {"srs": srs, "pce": pce}


def status_document(
    engine: Engine, *, memory_scale: float, gpu_faults: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """The whole ``GET /status`` answer, now."""
    now = engine.now()
    engine.tracker.queue_depth = queue_depth(engine)
    tracked = engine.tracker.snapshot(now)
    total = engine.total_budget_bytes
    used = budget_used_bytes(engine)
    pipe = engine.pipeline
    synthesizing = len(pipe.synthesizing)
    return {
        "uptime_secs": tracked["uptime_secs"],
        "memory": {
            "total_bytes": total,
            "used_bytes": used,
            "available_bytes": max(0, total - used),
        },
        "synthesis": {
            "max_concurrent": total // SNAP_PARTITION_FULL_BYTES,
            "active": tracked["synth_active"],
        },
        "pipelines": tracked["pipelines"],
        "gpu_workers": tracked["gpu_workers"],
        "allocations": _allocations(engine),
        "counters": tracked["counters"],
        "buffers": {
            "synth_in_flight": synthesizing + len(pipe.gpu_queue),
            "provers_in_flight": sum(1 for w in pipe.workers if w.part is not None),
            "aux_in_flight": 0,
            "shells_in_flight": 0,
            "pending_handles": len(pipe.finalizing),
        },
        "sim": _sim(engine, now, synthesizing, memory_scale, gpu_faults),
    }


def _sim(
    engine: Engine,
    now: float,
    synthesizing: int,
    memory_scale: float,
    gpu_faults: Mapping[int, str] | None,
) -> dict[str, Any]:
    """The simulator's own figures (not in the real daemon's answer)."""
    simulated = engine.memory.simulated_bytes
    return {
        "rss_simulated_bytes": simulated,
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
        "gpu_cpu_factor": engine.gpu_cpu_factor,
        "gpu_workers_per_device": engine.gpu_workers_per_device,
        "cpu_share": engine.cpu_share,
        # The machine's CPU busy share now (the model's; None without --cpu-share).
        "cpu_busy_share": (
            None
            if engine.cpu_share is None
            else round(model.cpu_busy_share(synthesizing, engine.cpu_share), 3)
        ),
        "running": sum(1 for j in engine.live_jobs() if j.state == "running"),
        "pce": engine.resident.pce,
        "workers_stopped": engine.stopped,
        "gpus": [
            {
                "index": gpu,
                "name": GPU_NAME,
                "vram_total_bytes": engine.vram_bytes,
                "vram_used_bytes": vram_used(engine),
                # NVML's utilization.gpu as the simulated GPU would report it.
                "utilisation": round(engine.gpu_use.utilisation(gpu, now), 3),
                **({"fault": gpu_faults[gpu]} if gpu_faults and gpu in gpu_faults else {}),
            }
            for gpu in range(engine.gpus)
        ],
    }


def vram_used(engine: Engine) -> int:
    """12 GiB of each GPU while any proof runs."""
    if not any(job.state == "running" for job in engine.live_jobs()):
        return 0
    return min(model.gib_bytes(model.GPU_VRAM_PROVING_GIB), engine.vram_bytes)
