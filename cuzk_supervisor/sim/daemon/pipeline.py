"""The PoRep partition pipeline as a pure discrete-event core (no I/O, no clock of its own).

Synthesis: partitions are synthesized in priority order (oldest job, lowest partition), ``slots``
at a time, sharing the machine (``model.partition_seconds``: while ``n`` synthesize, each
progresses at 1 / ``partition_seconds(n)`` of its work a second; its work is the job's factor).
The GPU stage, as engine.rs runs it: a free GPU worker prepares a synthesized partition on the
CPU (``prep``), waits for its device (the workers of one GPU take turns on it), runs the CUDA
work (``cuda``) and is free again; the finalization (``finalize``, on the CPU) goes on without
it and proves the partition; a job is proved when all its partitions are. A failed synthesis
(:meth:`Pipeline.fail`) is handled as the real engine does. All three: docs/simulator.md, "Model".

It also keeps ``hungry_since``: since when a synthesis slot has been free with no partition
waiting (idle capacity only a new job can fill). The engine reads it when a job arrives, which is
how a client that submits late is told apart from a slow pipeline (``sim.daemon.timeline``).

The engine drives it with the event loop's clock; ``simulate_closed_loop`` drives it with a
virtual one, which is how the model's long-run rate is tested without waiting. State changes
only at events (a start, an end): driving it to a time where nothing happens changes nothing, so
a replay driven at other instants meets the same times exactly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.pipeevents import (
    CudaFinished,
    CudaStarted,
    Event,
    GpuFinished,
    GpuSkipped,
    GpuStarted,
    JobProved,
    JobSynthesized,
    Part,
    Started,
    SynthesisFailed,
    Synthesized,
)

__all__ = [
    "CudaFinished",
    "CudaStarted",
    "Event",
    "GpuFinished",
    "GpuSkipped",
    "GpuStarted",
    "GpuTimes",
    "JobProved",
    "JobSynthesized",
    "Part",
    "Pipeline",
    "Started",
    "SynthesisFailed",
    "Synthesized",
    "batch_proofs_per_hour",
    "simulate_closed_loop",
]

EPSILON = 1e-9
"""Work left (in partition-units) below which a synthesis counts as ended: the float residue of
subtracting the time a deadline was computed from."""


RESERVED_GIB = 14
"""memory.rs: a PoRep partition's reservation, of which 13 GiB are freed when its CUDA work ends
(the a/b/c vectors) and 1 GiB when its finalizer ends."""


@dataclass(frozen=True, slots=True)
class GpuTimes:
    """Seconds of one partition's GPU stage steps (``model``'s, with the daemon's factors)."""

    prep: float = model.GPU_PREP_SECONDS
    cuda: float = model.GPU_CUDA_SECONDS
    finalize: float = model.GPU_FINALIZE_SECONDS


@dataclass(slots=True)
class _Worker:
    device: int
    part: Part | None = None
    picked_at: float = 0.0
    stage: str = "idle"
    """idle, prep (until ``until``), waiting (for its device), cuda (until ``until``)."""
    until: float = 0.0


class Pipeline:
    """Partition slots and GPU workers; every method takes the simulated time ``now``."""

    def __init__(
        self,
        slots: int,
        gpu_workers: int,
        factor: Callable[[int], float] = lambda seq: 1.0,
        partition_seconds: Callable[[int], float] = model.partition_seconds,
        gpu: GpuTimes | None = None,
        workers_per_device: int = model.GPU_WORKERS_PER_DEVICE,
        fails: Callable[[Part], bool] = lambda part: False,
        reservations: bool = False,
    ) -> None:
        self.slots = max(1, slots)
        self.reservations = reservations
        """Budget release: a partition holds its reservation (one slot) from its dispatch to the
        end of its CUDA work and 1/14 of one until its finalizer ends, and a partition starts
        only while that leaves room (memory.rs's budget), not only while fewer than ``slots``
        synthesize."""
        self._factor = factor
        self._fails = fails
        self._partition_seconds = partition_seconds
        self.gpu_times = gpu or GpuTimes()
        per = max(1, workers_per_device)
        self.workers = [_Worker(device=w // per) for w in range(max(1, gpu_workers))]
        self.devices = self.workers[-1].device + 1
        self.pending: deque[Part] = deque()
        self.synthesizing: dict[Part, tuple[float, float]] = {}
        """part -> (start, work left as of ``_synth_at``, in partition-units)."""
        self._synth_at = 0.0
        self._synth_deadline: float | None = None
        self.gpu_queue: list[Part] = []  # a heap: oldest job, lowest partition first
        self._device_queue: list[deque[int]] = [deque() for _ in range(self.devices)]
        self._device_busy: list[int | None] = [None] * self.devices  # the worker on CUDA
        self.finalizing: dict[Part, tuple[float, float, int]] = {}  # (picked, end, worker)
        self._unsynthesized: dict[int, int] = {}
        self._unproved: dict[int, int] = {}
        self.failed: set[int] = set()
        self.frozen = False
        self.clock = 0.0  # the latest time it has been driven to; work never starts earlier
        self.hungry_since: float | None = 0.0
        """Since when a synthesis slot has been free with no partition waiting (None while
        every slot is busy or work waits); as of ``clock``. Only a submission ends it."""

    # --- inputs ---------------------------------------------------------------------------
    def submit(
        self, seq: int, now: float, partitions: int = model.PARTITIONS_PER_POREP
    ) -> list[Event]:
        events = self.advance(now)
        self.pending.extend(Part(seq, i) for i in range(partitions))
        self._unsynthesized[seq] = partitions
        self._unproved[seq] = partitions
        return events + self._fill(now)

    def fail(self, seq: int, now: float, worker: int | None = None) -> list[Event]:
        """Job ``seq`` failed in its GPU stage (engine.rs: the job answered FAILED): its waiting
        partitions are dropped, those queued for a GPU skipped at pickup, those synthesizing
        run to their end; ``worker``, whose step failed, is free at once."""
        self._drop(seq)
        if worker is not None:
            freed = self.workers[worker]
            freed.stage, freed.part = "idle", None
        return self._fill(now)

    def stick(self, worker: int) -> None:
        """``worker``'s current GPU step never ends (a stuck partition: sim.machine.gpufaults)."""
        self.workers[worker].until = math.inf

    def _drop(self, seq: int) -> None:
        self.failed.add(seq)
        self.pending = deque(p for p in self.pending if p.seq != seq)
        self._unsynthesized.pop(seq, None)
        self._unproved.pop(seq, None)

    def freeze(self) -> None:
        """Stop all progress (SIGINT on the real daemon stops its workers)."""
        self.frozen = True

    @property
    def active(self) -> int:
        return len(self.synthesizing)

    # --- time -----------------------------------------------------------------------------
    def _synth_end(self) -> float | None:
        """When the next synthesis ends if nothing starts or ends before (cached: it changes
        only when the synthesizing set does)."""
        if self._synth_deadline is None and self.synthesizing:
            least = min(left for _, left in self.synthesizing.values())
            per = self._partition_seconds(len(self.synthesizing))
            self._synth_deadline = self._synth_at + least * per
        return self._synth_deadline

    def next_deadline(self) -> float | None:
        if self.frozen:
            return None
        ends = [w.until for w in self.workers if w.stage in ("prep", "cuda")]
        ends += [end for _, end, _ in self.finalizing.values()]
        synth = self._synth_end()
        if synth is not None:
            ends.append(synth)
        return min(ends, default=None)

    def advance(self, now: float) -> list[Event]:
        """Process every event due by ``now`` in time order, starting work as slots free."""
        events: list[Event] = []
        while (t := self.next_deadline()) is not None and t <= now:
            events += self._complete_at(t)
            events += self._fill(t)
        self.clock = max(self.clock, now)
        return events

    # --- internals ------------------------------------------------------------------------
    def _settle(self, t: float) -> None:
        """Bring every synthesizing partition's work left to time ``t`` (before ``n`` changes)."""
        if self.synthesizing and t > self._synth_at:
            done = (t - self._synth_at) / self._partition_seconds(len(self.synthesizing))
            self.synthesizing = {p: (s, left - done) for p, (s, left) in self.synthesizing.items()}
        self._synth_at = max(self._synth_at, t)
        self._synth_deadline = None

    def _complete_at(self, t: float) -> list[Event]:
        events: list[Event] = []
        synth = self._synth_end()
        if synth is not None and synth <= t:
            self._settle(t)
            for part in sorted(p for p, (_, left) in self.synthesizing.items() if left <= EPSILON):
                start, _ = self.synthesizing.pop(part)
                events.append(Synthesized(t, part, t - start))
                heapq.heappush(self.gpu_queue, part)
                if part.seq in self._unsynthesized:
                    self._unsynthesized[part.seq] -= 1
                    if self._unsynthesized[part.seq] == 0:
                        events.append(JobSynthesized(t, part.seq))
        for w, worker in enumerate(self.workers):
            if worker.stage == "prep" and worker.until <= t:
                worker.stage = "waiting"
                self._device_queue[worker.device].append(w)
            elif worker.stage == "cuda" and worker.until <= t:
                assert worker.part is not None
                events.append(CudaFinished(t, worker.part, w))
                self.finalizing[worker.part] = (worker.picked_at, t + self.gpu_times.finalize, w)
                self._device_busy[worker.device] = None
                worker.stage, worker.part = "idle", None
        for part in sorted(p for p, (_, end, _) in self.finalizing.items() if end <= t):
            picked, _, w = self.finalizing.pop(part)
            events.append(GpuFinished(t, part, w, t - picked))
            if part.seq in self._unproved:
                self._unproved[part.seq] -= 1
                if self._unproved[part.seq] == 0:
                    del self._unproved[part.seq], self._unsynthesized[part.seq]
                    events.append(JobProved(t, part.seq))
        return events

    def _fill(self, t: float) -> list[Event]:
        events: list[Event] = []
        if self.frozen:
            return events
        taken: list[tuple[Part, bool]] = []  # in priority order, and whether it fails
        while self.pending and self._room(len(taken)):
            part = self.pending.popleft()
            fails = self._fails(part)
            taken.append((part, fails))
            if fails:  # engine.rs: partition_failed, the job failed, its slot free at once
                self._drop(part.seq)
        if taken:
            self._settle(t)
            ok = [part for part, fails in taken if not fails]
            active = len(self.synthesizing) + len(ok)
            base = self._partition_seconds(active)
            for part, fails in taken:
                if fails:
                    events.append(Started(t, part, active, 0.0))
                    events.append(SynthesisFailed(t, part))
                    continue
                work = self._factor(part.seq)
                self.synthesizing[part] = (t, work)
                events.append(Started(t, part, active, base * work))
        events += self._pick_up(t)
        for device, waiting in enumerate(self._device_queue):
            if waiting and self._device_busy[device] is None:
                w = waiting.popleft()
                worker = self.workers[w]
                assert worker.part is not None
                worker.stage, worker.until = "cuda", t + self.gpu_times.cuda
                self._device_busy[device] = w
                events.append(CudaStarted(t, worker.part, w))
        self._note_hunger(t)
        return events

    def held(self) -> float:
        """Reservations held, in slots (the module's budget): every partition between its
        dispatch and the end of its CUDA work, 1/14 for each one finalizing."""
        held = len(self.synthesizing) + len(self.gpu_queue)
        held += sum(1 for w in self.workers if w.part is not None)
        return held + len(self.finalizing) / RESERVED_GIB

    def _room(self, taking: int) -> bool:
        if len(self.synthesizing) + taking >= self.slots:
            return False
        return not self.reservations or self.held() + taking + 1 <= self.slots + EPSILON

    def _pick_up(self, t: float) -> list[Event]:
        events: list[Event] = []
        for w, worker in enumerate(self.workers):
            while worker.stage == "idle" and self.gpu_queue:
                part = heapq.heappop(self.gpu_queue)
                events.append(GpuStarted(t, part, w))
                if part.seq in self.failed:  # the real worker checks and skips at once
                    events.append(GpuSkipped(t, part, w))
                    continue
                worker.part, worker.picked_at = part, t
                worker.stage, worker.until = "prep", t + self.gpu_times.prep
        return events

    def _note_hunger(self, t: float) -> None:
        if self.pending or len(self.synthesizing) >= self.slots:
            self.hungry_since = None
        elif self.hungry_since is None:
            self.hungry_since = t


def simulate_closed_loop(
    slots: int,
    gpu_workers: int,
    concurrency: int,
    proofs: int,
    *,
    gpu: GpuTimes | None = None,
    workers_per_device: int = model.GPU_WORKERS_PER_DEVICE,
    partition_seconds: Callable[[int], float] = model.partition_seconds,
) -> list[float]:
    """Completion times of ``proofs`` PoRep proofs from a client that keeps ``concurrency`` in
    flight, submitting the next as soon as one completes (all at t=0 to begin with)."""
    pipe = Pipeline(
        slots, gpu_workers, partition_seconds=partition_seconds, gpu=gpu,
        workers_per_device=workers_per_device,
    )  # fmt: skip
    done: list[float] = []
    submitted = 0
    for _ in range(min(concurrency, proofs)):
        pipe.submit(submitted, 0.0)
        submitted += 1
    while len(done) < proofs:
        t = pipe.next_deadline()
        if t is None:
            raise RuntimeError("pipeline stalled")
        for event in pipe.advance(t):
            if isinstance(event, JobProved):
                done.append(event.at)
                if submitted < proofs:
                    pipe.submit(submitted, event.at)
                    submitted += 1
    return done


def batch_proofs_per_hour(slots: int, gpu_workers: int, concurrency: int, proofs: int) -> float:
    """What a client measures (completed / wall x 3600) for one closed-loop batch from idle."""
    done = simulate_closed_loop(slots, gpu_workers, concurrency, proofs)
    return proofs / done[-1] * 3600.0
