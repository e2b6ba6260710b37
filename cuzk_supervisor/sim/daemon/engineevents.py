"""The pipeline's events moving the simulated engine's jobs on: a partition started, synthesized
or failed, a GPU step started or finished, a job synthesized or proved, the PCE extracted.

``PipelineEvents`` is the part of :class:`~cuzk_supervisor.sim.daemon.engine.Engine` that turns the
pure ``Pipeline``'s events into the engine's state: the status tracker and the GPUs' use follow
every event (a failed job's leftovers too, as the real daemon's do), partitions hold their memory
from their start to the end of their synthesis, a ``fail`` fault at a partition's start fails its
job, the GPUs' trouble (:class:`GpuSteps`) acts at a GPU step's start, and the next deadline of
the pipeline is one timer on the engine's clock (processed at its ideal time: ``engine``).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
from typing import TYPE_CHECKING

from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.job import Job
from cuzk_supervisor.sim.daemon.pipeline import (
    Event,
    GpuFinished,
    GpuStarted,
    JobProved,
    JobSynthesized,
    Part,
    Pipeline,
    Started,
    SynthesisFailed,
    Synthesized,
)
from cuzk_supervisor.sim.daemon.pipestatus import GpuUse, track
from cuzk_supervisor.sim.machine.gpufaults import TARGET
from cuzk_supervisor.sim.machine.gpustate import GpuState

if TYPE_CHECKING:
    from cuzk_supervisor.sim.clock import SimClock
    from cuzk_supervisor.sim.daemon.chaos import FaultController
    from cuzk_supervisor.sim.daemon.logfmt import DaemonLog
    from cuzk_supervisor.sim.daemon.memory import Memory
    from cuzk_supervisor.sim.daemon.residency import Residency
    from cuzk_supervisor.sim.daemon.statustrack import StatusTracker


class PipelineEvents:
    """The engine's handling of the pipeline's events (a base of ``Engine``, which sets these
    attributes and gives ``_finish`` and ``_complete``)."""

    pipeline: Pipeline
    gpu_workers_per_device: int
    tracker: StatusTracker
    gpu_use: GpuUse
    memory: Memory
    log: DaemonLog
    faults: FaultController | None
    resident: Residency
    gpu_steps: GpuSteps | None
    clock: SimClock | None
    _by_seq: dict[int, Job]
    _failures: dict[int, str]
    _timer: asyncio.TimerHandle | None

    def _finish(self, job: Job, error: str | None, at: float | None) -> None:
        raise NotImplementedError

    def _complete(self, job: Job, at: float | None = None) -> None:
        raise NotImplementedError

    def _on_deadline(self, t: float) -> None:
        self._timer = None
        self._handle(self.pipeline.advance(t))

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            job = self._by_seq[event.seq]
            # The tracker and the memory follow a failed job's leftovers too, as the real
            # daemon's do (its synthesizing partitions run to their end).
            track(self.tracker, job.job_id, event)
            self.gpu_use.on_event(event)
            if isinstance(event, Started):
                self._on_started(job, event)
            elif isinstance(event, SynthesisFailed | Synthesized):
                self.memory.free(("partition", event.part))
            if job.state != "done":
                self._apply(job, event)
        self._reschedule()

    def _fails(self, part: Part) -> bool:
        """Whether partition ``part`` fails as it starts synthesis (a ``fail`` fault there)."""
        if self.faults is None:
            return False
        fired = self.faults.check("partition", partition=part.index)
        failure = next((spec for spec in fired if spec.kind == "fail"), None)
        if failure is not None:
            self._failures[part.seq] = failure.message
        return failure is not None

    def _apply(self, job: Job, event: Event) -> None:
        if isinstance(event, Started) and job.state == "queued":
            job.state, job.started_at = "running", event.at
        elif isinstance(event, SynthesisFailed):
            # engine.rs: the job is failed and answered; it is never completed (no
            # job_completed), so GET /status lists it for the daemon's life.
            self._finish(job, self._failures.pop(job.seq, "synthesis failed"), event.at)
        elif isinstance(event, Synthesized):
            job.synthesis_s += event.seconds
            self.log.debug(
                "cuzk_core::pipeline",
                "partition synthesized",
                job_id=job.job_id,
                partition=event.part.index,
                elapsed_ms=round(event.seconds * 1000),
            )
        elif isinstance(event, GpuStarted):
            if self.gpu_steps is not None:  # the GPUs' trouble (GpuSteps, below)
                self.gpu_steps.started(self, job, event)
        elif isinstance(event, GpuFinished):
            job.gpu_s += event.seconds
            self.log.debug(
                "cuzk_core::gpu",
                "partition proved",
                job_id=job.job_id,
                partition=event.part.index,
                gpu_worker=event.worker,
            )
        elif isinstance(event, JobSynthesized):
            self.log.info("cuzk_core::pipeline", "all partitions synthesized", job_id=job.job_id)
            if self.resident.pce == "absent":
                job.awaiting_pce = True
                self.resident.extract_pce(event.at, job.job_id, lambda at: self._pce_done(job, at))
        elif isinstance(event, JobProved):
            job.proved = True
            if not job.awaiting_pce:
                self._complete(job, event.at)

    def _pce_done(self, job: Job, at: float) -> None:
        job.awaiting_pce = False
        if job.proved:
            self._complete(job, at)

    def _on_started(self, job: Job, event: Started) -> None:
        self.log.debug(
            "cuzk_core::pipeline",
            "partition synthesis started",
            job_id=job.job_id,
            partition=event.part.index,
            active=event.active,
        )
        # Its real pages come from a worker thread: page faults on the loop would hold up every
        # answer and the next submission's headers (sim.daemon.pages).
        self.memory.alloc(("partition", event.part), model.PARTITION_GIB, background=True)

    def fail_job(self, job: Job, error: str, at: float, worker: int | None = None) -> None:
        """End ``job`` as failed now, as engine.rs does when a partition's GPU step fails: the
        job is answered FAILED, its waiting partitions are dropped and those synthesizing run
        to their end; ``worker`` (whose step failed) is free at once, while its status entry
        stays ``proving`` until its next pickup (no ``partition_gpu_end``, as in engine.rs)."""
        events = self.pipeline.fail(job.seq, at, worker)
        self._finish(job, error, at)
        self._handle(events)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.pipeline.next_deadline()
        if deadline is not None and math.isfinite(deadline) and self.clock is not None:
            self._timer = self.clock.call_at(deadline, self._on_deadline, deadline)


class GpuSteps:
    """What the GPUs' condition (``sim.machine.gpustate``, changed by ``sim.machine.gpufaults``)
    does to the engine's GPU steps: called as a partition reaches a GPU worker and as a proof
    is about to be returned."""

    def __init__(self, state: GpuState, faults: FaultController | None, log: DaemonLog) -> None:
        self.state = state
        self._faults = faults
        self._log = log
        self._wrong: dict[int, int] = {}  # job seq -> the GPU that computed a wrong partition

    def started(self, engine: PipelineEvents, job: Job, event: GpuStarted) -> None:
        """A partition reached a GPU worker: the GPU's trouble, if any, happens now."""
        gpu = event.worker // max(1, engine.gpu_workers_per_device)
        condition = self.state.condition(gpu)
        index = event.part.index
        if condition.crash:
            self._log.error(TARGET, "CUDA error: an illegal memory access was encountered",
                            gpu=gpu, job_id=job.job_id, partition=index)  # fmt: skip
            os.kill(os.getpid(), signal.SIGSEGV)
        if condition.lost:
            error = (f"partition {index} GPU prove failed: CUDA error 999: unspecified launch "
                     f"failure (simulated: GPU {gpu} {condition.lost})")  # fmt: skip
            self._log.error("cuzk_core::engine", "partition GPU proving failed",
                            job_id=job.job_id, partition=index, error=error)  # fmt: skip
            engine.fail_job(job, error, event.at, worker=event.worker)
            return
        if condition.corrupt:
            self._wrong[job.seq] = gpu
        if self._faults is not None:
            fired = self._faults.check("gpu", partition=index)
            if any(spec.kind == "stuck" for spec in fired):
                engine.pipeline.stick(event.worker)

    def self_check(self, job: Job) -> str | None:
        """The error of a proof whose partition a corrupt GPU proved (None: it verifies)."""
        gpu = self._wrong.pop(job.seq, None)
        if gpu is None:
            return None
        self._log.error("cuzk_core::engine", "PoRep proof self-check FAILED — proof will NOT be "
                        "returned to caller", job_id=job.job_id)  # fmt: skip
        return (f"PoRep proof self-check failed: assembled proof did not verify (simulated: GPU "
                f"{gpu} computes wrong results)")  # fmt: skip
