"""The job engine: jobs taken in and answered, and the partition pipeline run on the event
loop's clock with the memory it holds. Quirks of the real engine are kept on purpose: no
de-duplication (a second SubmitProof with the same id proves again), results kept for the
process lifetime, and the *first* finished result of an id is the one AwaitProof and Prove
return (they look in the finished results before the running jobs).

Here: a job's submission, its input parsed (inline, or a 50 MB C1 in a thread), its admission
to the pipeline once the PoRep SRS (and PCE) is resident, and its end (the answer its waiters
get, the counters, the timeline). A job's record and answer are ``sim.daemon.job``'s; what the
pipeline's events do to the jobs is ``sim.daemon.engineevents``'s (``PipelineEvents``, this class's
base).

Timing: the pure ``Pipeline`` works in simulated seconds; each of its deadlines is turned into
one ``loop.call_at`` at ``t0 + t / scale``, and a fired deadline is processed at its *ideal*
time, so late callbacks never accumulate drift. With a ``Timeline`` each job's times on that
exact clock are recorded as it enters the pipeline and as it ends (``sim.daemon.timeline``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.clock import SimClock
from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.c1 import check_c1
from cuzk_supervisor.sim.daemon.chaos import FaultController
from cuzk_supervisor.sim.daemon.engineevents import GpuSteps, PipelineEvents
from cuzk_supervisor.sim.daemon.job import POREP, Job
from cuzk_supervisor.sim.daemon.logfmt import DaemonLog
from cuzk_supervisor.sim.daemon.memory import Memory
from cuzk_supervisor.sim.daemon.pipeline import GpuTimes, Pipeline
from cuzk_supervisor.sim.daemon.pipestatus import GpuUse
from cuzk_supervisor.sim.daemon.residency import POREP_CIRCUIT, Release, Residency
from cuzk_supervisor.sim.daemon.statustrack import StatusTracker
from cuzk_supervisor.sim.daemon.timeline import Timeline, starved_s

# Parse small inputs inline; a 50 MB C1 in a thread, after SubmitProof has answered.
INLINE_PARSE_BYTES = 1 << 20


class Engine(PipelineEvents):
    def __init__(
        self,
        *,
        release: Release,
        slots: int,
        gpus: int,
        gpu_workers_per_device: int,
        param_cache: Path,
        total_budget_bytes: int,
        memory: Memory,
        log: DaemonLog,
        time_scale: float,
        faults: FaultController | None = None,
        first_proof_factor: float = model.FIRST_PROOF_AFTER_START_FACTOR,
        vram_bytes: int = model.gib_bytes(model.GPU_VRAM_GIB),
        timeline: Timeline | None = None,
        synthesis_factor: float = 1.0,
        gpu_factor: float = 1.0,
        cpu_share: float | None = None,
        gpu_cpu_factor: float = 1.0,
    ) -> None:
        self.release = release
        self.synthesis_factor = synthesis_factor
        self.gpu_factor = gpu_factor
        self.gpu_cpu_factor = gpu_cpu_factor
        """The CPU parts of the GPU stage (preparation, finalization) this many times slower."""
        self.cpu_share = cpu_share
        """The share of the CPU synthesis would use that it gets (``--cpu-share``); None: all."""
        self.vram_bytes = vram_bytes  # of each GPU
        self.first_proof_factor = first_proof_factor
        self.time_scale = time_scale
        self.slots = slots
        self.gpus = gpus
        self.gpu_workers = max(1, gpus * gpu_workers_per_device)
        self.gpu_workers_per_device = gpu_workers_per_device
        self.total_budget_bytes = total_budget_bytes
        self.memory = memory
        self.log = log
        self.faults = faults
        self.timeline = timeline
        self._last_answered = 0.0  # when the latest result was set (loop clock, simulated s)
        # Answers no later PoRep submission has followed yet, oldest first: (seq, answered at).
        self._unreplied: deque[tuple[int, float]] = deque()
        self.clock: SimClock | None = None
        cpu = gpu_cpu_factor
        self.pipeline = Pipeline(
            slots,
            self.gpu_workers,
            factor=self._factor,
            partition_seconds=self._partition_seconds,
            gpu=GpuTimes(
                prep=model.GPU_PREP_SECONDS * cpu,
                cuda=model.GPU_CUDA_SECONDS * gpu_factor,
                finalize=model.GPU_FINALIZE_SECONDS * cpu,
            ),
            workers_per_device=gpu_workers_per_device,
            fails=self._fails,
            reservations=release == "budget",
        )
        # What GET /status reports, kept as status.rs keeps it (sim.daemon.statustrack).
        self.tracker = StatusTracker()
        per = max(1, gpu_workers_per_device)
        self.tracker.register_workers([(w, w // per) for w in range(self.gpu_workers)])
        self.gpu_use = GpuUse(self.pipeline.devices, per)
        self._failures: dict[int, str] = {}  # job seq -> why its synthesis failed
        self.jobs: dict[str, Job] = {}  # job_id -> the latest job with that id
        # job_id -> the result of the latest of its jobs to finish (a later one overwrites it)
        self.results: dict[str, pb.AwaitProofResponse] = {}
        # job_id -> what every caller waiting under it gets: the first of its jobs to finish
        self._answers: dict[str, asyncio.Future[pb.AwaitProofResponse]] = {}
        self._by_seq: dict[int, Job] = {}
        self._live: dict[int, Job] = {}  # not finished yet, by submission order
        self._seq = 0
        self.submissions: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()  # by queue name
        self.failed: Counter[str] = Counter()
        self.duration_s: defaultdict[str, float] = defaultdict(float)  # seconds, not a count
        self.resident = Residency(release=release, param_cache=param_cache, memory=memory, log=log)
        self._admit: deque[Job] = deque()
        self._porep_admitted = False
        self._porep_ready_at = 0.0  # when the PoRep SRS (and cached PCE) became resident
        self._timer: asyncio.TimerHandle | None = None
        self.stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.gpu_steps: GpuSteps | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the clock (needs the running loop)."""
        self.clock = SimClock(self.time_scale)
        self.resident.clock = self.clock
        if self.timeline is not None:
            self.timeline.start(
                time_scale=self.time_scale, synthesis_slots=self.slots, gpu_workers=self.gpu_workers
            )
        self.log.info(
            "cuzk_core::engine",
            "cuzk engine started",
            release=self.release,
            synthesis_slots=self.slots,
            gpus=self.gpus,
            gpu_workers=self.gpu_workers,
        )

    def _partition_seconds(self, active: int) -> float:
        return model.partition_seconds(active, self.cpu_share) * self.synthesis_factor

    def now(self) -> float:
        assert self.clock is not None
        return self.clock.now()

    async def preload(self, circuits: tuple[str, ...]) -> None:
        """Workers release: load the listed SRS (and the PoRep PCE if cached) before serving."""
        for circuit in circuits:
            if circuit not in model.SRS_GIB:
                self.log.warn(
                    "cuzk_core::srs", "unknown circuit in preload, skipped", circuit_id=circuit
                )
                continue
            await self.resident.load_srs(circuit)
            if circuit == POREP_CIRCUIT:
                await self.resident.load_pce_if_cached()

    def stop_workers(self) -> None:
        """SIGINT: running and queued proofs stop progressing; the server keeps answering."""
        self.stopped = self.resident.stopped = True
        self.pipeline.freeze()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.log.info("cuzk_core::engine", "shutdown signal received, stopping engine workers")

    @property
    def completed_total(self) -> int:
        return sum(self.completed.values())

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    # --- jobs ---------------------------------------------------------------------------
    def submit(self, request: pb.SubmitProofRequest, arrived: float | None = None) -> Job:
        """Enqueue at once (no de-duplication: the same request_id proves again).

        ``arrived`` is the loop time the call's headers came in. The job counts from then:
        receiving and parsing a 50 MB input takes a real ~0.2 s that the real daemon spends
        in milliseconds, and must not become 20 simulated seconds.
        """
        assert self.clock is not None
        job_id = request.request_id or str(uuid.uuid4())
        self.submissions[job_id] += 1
        since = self.now() if arrived is None else min(self.now(), self.clock.at(arrived))
        job = Job(job_id, self._seq, request.proof_kind, since, request.vanilla_proof)
        self._seq += 1
        self._by_seq[job.seq] = job
        self._live[job.seq] = job
        self.jobs[job_id] = job
        answer = self._answers.get(job_id)
        if answer is None or answer.done():
            self._answers[job_id] = asyncio.get_running_loop().create_future()
        self.log.info(
            "cuzk_core::engine",
            "proof submitted",
            job_id=job_id,
            kind=job.queue,
            input_bytes=len(job.payload),
            queue_position=self.queue_position(job),
        )
        if job.kind == POREP:
            self._admit.append(job)
            self._parse(job)
            self._spawn(self._ensure_porep_ready())
        else:
            self._spawn(self._run_single_step(job))
        return job

    async def wait(self, job_id: str) -> pb.AwaitProofResponse:
        """The result of the first of ``job_id``'s running jobs to finish (the real engine's
        waiters are keyed by id: two jobs under one id answer every waiter with the first); a
        cut call (shield) never cancels the job, which keeps running."""
        return await asyncio.shield(self._answers[job_id])

    def job_by_seq(self, seq: int) -> Job:
        return self._by_seq[seq]

    def live_jobs(self) -> list[Job]:
        """Jobs not finished, in submission order (a replaced job id included)."""
        return list(self._live.values())

    def queue_position(self, job: Job) -> int:
        return sum(1 for j in self._live.values() if j.state == "queued" and j.seq < job.seq)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _parse(self, job: Job) -> None:
        if len(job.payload) <= INLINE_PARSE_BYTES:
            job.error, job.parsed, job.payload = check_c1(job.payload), True, b""
            # Start work after SubmitProof has returned, as the real engine's queue does.
            asyncio.get_running_loop().call_soon(self._pump_admission)
            return

        async def parse_in_thread() -> None:
            job.error = await asyncio.to_thread(check_c1, job.payload)
            job.parsed, job.payload = True, b""
            self._pump_admission()

        self._spawn(parse_in_thread())

    async def _ensure_porep_ready(self) -> None:
        if POREP_CIRCUIT not in self.resident.srs:
            await self.resident.load_srs(POREP_CIRCUIT)
            await self.resident.load_pce_if_cached()
            self._porep_ready_at = self.now()
        self._pump_admission()

    def _pump_admission(self) -> None:
        """Hand parsed jobs to the pipeline in submission order once the SRS is resident."""
        while self._admit and not self.stopped:
            job = self._admit[0]
            if not job.parsed:
                return
            if job.error is not None:
                self._admit.popleft()
                self._finish(job, job.error, self.now())
                continue
            if not self.resident.loaded(POREP_CIRCUIT) or self.resident.pce == "loading":
                return
            self._admit.popleft()
            if not self._porep_admitted:
                job.factor = self.first_proof_factor
                self._porep_admitted = True
            # Start from the job's arrival if the pipeline had nothing newer to do since.
            at = max(job.submitted_at, self.pipeline.clock, self._porep_ready_at)
            events = self.pipeline.advance(at)
            job.admitted_at = at
            since = self._last_answered
            if self._unreplied:
                job.reply_to, since = self._unreplied.popleft()
            job.starved_s = starved_s(job.submitted_at, self.pipeline.hungry_since, since)
            if self.timeline is not None:
                self.timeline.job(job.times("admitted"))
            self._handle(events)
            # engine.rs registers the job once its C1 is parsed and its SRS loaded.
            self.tracker.register_job(job.job_id, job.queue, model.PARTITIONS_PER_POREP, at)
            self._handle(self.pipeline.submit(job.seq, at))

    def _factor(self, seq: int) -> float:
        factor = self._by_seq[seq].factor
        if self.resident.pce != "ready":
            factor *= model.NO_PCE_SYNTHESIS_FACTOR
        return factor

    async def _run_single_step(self, job: Job) -> None:
        """Non-PoRep kinds: load their SRS if needed, then one short step."""
        assert self.clock is not None
        job.srs_load_s = await self.resident.load_srs(model.CIRCUIT[job.kind])
        if self.stopped:
            return
        job.state, job.started_at = "running", self.now()
        end = job.started_at + model.SINGLE_STEP_SECONDS[job.kind]
        self.clock.call_at(end, self._single_step_done, job, end)

    def _single_step_done(self, job: Job, at: float) -> None:
        if not self.stopped:
            job.gpu_s = model.SINGLE_STEP_SECONDS[job.kind]
            self._complete(job, at)

    # --- results --------------------------------------------------------------------------
    def _complete(self, job: Job, at: float | None = None) -> None:
        """The proof is done; a ``fail`` fault may still turn it into a failure (the real
        self-check's: counted in ``/status`` and listed 30 s, as a completed job is)."""
        failure = None
        if self.faults is not None:
            fired = self.faults.check("finishing")
            failure = next((spec for spec in fired if spec.kind == "fail"), None)
        error = None if failure is None else failure.message
        # A corrupt GPU's proof (sim.machine.gpufaults).
        if error is None and self.gpu_steps is not None:
            error = self.gpu_steps.self_check(job)
        if job.kind == POREP and job.state != "done":  # only partitioned jobs are tracked
            end = self.now() if at is None else at
            self.tracker.job_completed(job.job_id, job.queue, error is None, end)
        self._finish(job, error, at)

    def _finish(self, job: Job, error: str | None, at: float | None) -> None:
        if job.state == "done":
            return
        end = self.now() if at is None else at
        job.state = "done"
        del self._live[job.seq]
        response = job.answer(error, end)
        self.duration_s[job.queue] += end - job.submitted_at
        self.results[job.job_id] = response
        answer = self._answers.get(job.job_id)
        if answer is not None and not answer.done():
            answer.set_result(response)
        answered = self.now()
        self._last_answered = max(self._last_answered, answered)
        self._unreplied.append((job.seq, answered))
        if self.timeline is not None:
            status = "failed" if error else "completed"
            self.timeline.job(job.times(status, end, max(answered, end)))
        if error:
            self.failed[job.queue] += 1
            self.log.error("cuzk_core::engine", "proof failed", job_id=job.job_id, error=error)
        else:
            self.completed[job.queue] += 1
            if job.kind == POREP:
                self.log.info(
                    "cuzk_core::prover", "PoRep proof self-check PASSED", job_id=job.job_id
                )
            self.log.info(
                "cuzk_core::engine",
                "proof completed",
                job_id=job.job_id,
                kind=job.queue,
                total_ms=response.total_ms,
            )
            if self.faults is not None:
                self.faults.check("completed")
