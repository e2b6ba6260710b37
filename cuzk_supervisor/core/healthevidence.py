"""What the run phase's health watch sees, as plain values, and the two readers that make them.

- :func:`daemon_view`: one ``GET /status`` document of the daemon's HTTP listener to a
  :class:`DaemonView`. Written against the real shape (``cuzk-core/src/status.rs``,
  ``StatusSnapshot``), quirks included: ``synth_ms``/``gpu_ms`` are live (elapsed while the
  step runs), ``busy_secs`` is the time since the worker's current pickup, ``counters
  .total_failed`` counts failed self-checks only, and a job that failed is never marked completed:
  it stays listed for the daemon's life, a synthesis failure with ``failed`` partitions, a GPU
  failure with its partition shown ``done`` and the job's later partitions left in ``gpu`` (the
  engine marks them GPU-started, then skips them: ``engine.rs``, "skipping GPU prove for failed
  partitioned job"). The daemon's durations are on its own clock; ``time_scale`` (the simulator's,
  1 for the real daemon) turns them into the supervisor's seconds.
- :func:`proof_totals`: the daemon's own totals from its ``GetMetrics`` text
  (``cuzk_proofs_completed_total``, ``cuzk_proofs_failed_total``: the engine's job tracker, the
  same figures ``GetStatus`` returns, ``cuzk-server/src/service.rs``, without the ``nvidia-smi``
  run ``GetStatus`` makes on every call, which is what hangs on a GPU fallen off the bus). Its
  failures count every failed proof: a failed synthesis, a failed GPU step, a failed self-check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

IN_FLIGHT_STATES = frozenset({"pending", "synthesizing", "synth_done", "gpu"})
"""A partition's states while its proof is still being worked on (status.rs ``PartitionPhase``)."""


@dataclass(frozen=True, slots=True)
class PartitionView:
    job_id: str
    index: int
    state: str
    gpu_s: float | None = None
    """The GPU stage's time so far (live while in ``gpu``), supervisor seconds; None before."""


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: int
    gpu: int
    proving: bool
    job_id: str | None = None
    partition: int | None = None
    busy_s: float | None = None
    """Since the current pickup (status.rs ``busy_secs``), supervisor seconds."""


@dataclass(frozen=True, slots=True)
class DaemonView:
    """One answer of the daemon's HTTP status."""

    uptime_s: float
    completed: int
    self_check_failures: int
    partitions: tuple[PartitionView, ...] = ()
    workers: tuple[WorkerView, ...] = ()
    failed_jobs: frozenset[str] = frozenset()
    """Jobs with a ``failed`` partition (a failed synthesis): listed for the daemon's life."""

    def jobs(self) -> frozenset[str]:
        return frozenset(p.job_id for p in self.partitions)

    def in_flight(self, ignore: frozenset[str] = frozenset()) -> tuple[PartitionView, ...]:
        """Partitions still being worked on, of jobs not known to have failed."""
        dead = self.failed_jobs | ignore
        return tuple(
            p for p in self.partitions if p.state in IN_FLIGHT_STATES and p.job_id not in dead
        )

    def gpu_loaded(self, gpu: int, ignore: frozenset[str] = frozenset()) -> bool:
        """A worker of ``gpu`` is proving a partition of a job not known to have failed."""
        dead = self.failed_jobs | ignore
        return any(w.proving and w.gpu == gpu and w.job_id not in dead for w in self.workers)


@dataclass(frozen=True, slots=True)
class ProofTotals:
    """The daemon's totals since its start (every failed proof counted)."""

    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as NVML saw it at an observation (None: not reported by this GPU or driver)."""

    index: int
    answering: bool = True
    error: str = ""
    """Why it did not answer (an NVML error's text)."""
    xids: tuple[int, ...] = ()
    """XID events since the previous observation, in order (the event set's)."""
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile counter)."""
    retired_pages: int | None = None
    """Pages retired for double-bit ECC errors, or rows remapped for uncorrectable ones (A100
    and later remap rows instead of retiring pages)."""
    retirement_pending: bool | None = None
    """A retirement or a remapping waits for a GPU reset."""
    remap_failed: bool = False
    """A row could not be remapped: the GPU's memory is failing."""
    utilisation: float | None = None
    sm_clock_ratio: float | None = None
    slowdowns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything the watch saw at one tick, at ``at`` (the supervisor's monotonic seconds)."""

    at: float
    daemon: DaemonView | None = None
    """None: the status did not answer (or no listener is configured)."""
    totals: ProofTotals | None = None
    """None: ``GetMetrics`` did not answer."""
    gpus: tuple[GpuView, ...] | None = None
    """None: no NVML to read (no driver, ``gpu_probe`` not nvml)."""
    daemon_starts: int = 0
    """Starts of the daemon so far (any change: a new process, its totals start again)."""
    daemon_exits: int = 0
    """Exits of the daemon so far (crashes, kills; not our own replacements)."""
    crash_loop: str = ""
    """The keeper gave up on the daemon (a crash loop): its verdict."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _int(value: Any, default: int = 0) -> int:
    number = _number(value)
    return int(number) if number is not None else default


def _seconds(value: Any, per_s: float, time_scale: float) -> float | None:
    number = _number(value)
    return None if number is None else number / per_s / time_scale


def daemon_view(document: object, time_scale: float = 1.0) -> DaemonView | None:
    """The evidence in one ``/status`` document; None when it is not the daemon's (no
    ``counters`` object). Items that are not what the daemon writes are left out, never fatal."""
    if not isinstance(document, dict):
        return None
    counters = document.get("counters")
    if not isinstance(counters, dict):
        return None
    scale = time_scale if time_scale > 0 else 1.0
    partitions: list[PartitionView] = []
    failed_jobs: set[str] = set()
    for pipeline in document.get("pipelines") or ():
        if not isinstance(pipeline, dict):
            continue
        job = str(pipeline.get("job_id", ""))
        for part in pipeline.get("partitions") or ():
            if not isinstance(part, dict):
                continue
            state = str(part.get("state", ""))
            if state == "failed":
                failed_jobs.add(job)
            gpu_s = _seconds(part.get("gpu_ms"), 1000.0, scale)
            partitions.append(PartitionView(job, _int(part.get("index")), state, gpu_s))
    workers = []
    for i, worker in enumerate(document.get("gpu_workers") or ()):
        if not isinstance(worker, dict):
            continue
        job_id = worker.get("current_job")
        index = worker.get("current_partition")
        workers.append(
            WorkerView(
                worker_id=_int(worker.get("worker_id"), i),
                gpu=_int(worker.get("gpu_ordinal")),
                proving=worker.get("state") == "proving",
                job_id=str(job_id) if job_id is not None else None,
                partition=_int(index) if _number(index) is not None else None,
                busy_s=_seconds(worker.get("busy_secs"), 1.0, scale),
            )
        )
    return DaemonView(
        uptime_s=_seconds(document.get("uptime_secs"), 1.0, scale) or 0.0,
        completed=_int(counters.get("total_completed")),
        self_check_failures=_int(counters.get("total_failed")),
        partitions=tuple(partitions),
        workers=tuple(workers),
        failed_jobs=frozenset(failed_jobs),
    )


_TOTAL = re.compile(r"^(cuzk_proofs_(?:completed|failed)_total)\s+([0-9.eE+]+)\s*$", re.M)


def proof_totals(metrics_text: str) -> ProofTotals | None:
    """The completed and failed totals of the daemon's ``GetMetrics`` text; None when either
    is missing."""
    found: dict[str, float] = {}
    for name, value in _TOTAL.findall(metrics_text):
        try:
            found[name] = float(value)
        except ValueError:
            return None
    completed = found.get("cuzk_proofs_completed_total")
    failed = found.get("cuzk_proofs_failed_total")
    if completed is None or failed is None:
        return None
    return ProofTotals(int(completed), int(failed))
