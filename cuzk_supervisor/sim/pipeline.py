"""The PoRep partition pipeline as a pure discrete-event core (no I/O, no clock of its own).

Partitions are synthesized FIFO across all jobs in submission order, ``slots`` at a time; each
takes ``partition_seconds(active)`` times the job's factor, ``active`` being the number
synthesizing once every partition that can start at that instant has started. A synthesized
partition then queues for one of ``gpu_workers`` GPU workers (3 s each), overlapping with later
synthesis. A job is proved when all its partitions are through the GPU.

It also keeps ``hungry_since``: since when a synthesis slot has been free with no partition
waiting (idle capacity only a new job can fill). The engine reads it when a job arrives, which is
how a client that submits late is told apart from a slow pipeline (``sim.timeline``).

The engine drives it with the event loop's clock; ``simulate_closed_loop`` drives it with a
virtual one, which is how the model's long-run rate is tested without waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cuzk_supervisor.sim import model


@dataclass(frozen=True, order=True, slots=True)
class Part:
    """Partition ``index`` of the job with submission sequence number ``seq``."""

    seq: int
    index: int


@dataclass(frozen=True, slots=True)
class Started:
    at: float
    part: Part
    active: int
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class Synthesized:
    at: float
    part: Part
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class GpuStarted:
    at: float
    part: Part
    worker: int

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class GpuFinished:
    at: float
    part: Part
    worker: int
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class JobSynthesized:
    at: float
    seq: int


@dataclass(frozen=True, slots=True)
class JobProved:
    at: float
    seq: int


Event = Started | Synthesized | GpuStarted | GpuFinished | JobSynthesized | JobProved


class Pipeline:
    """Partition slots and GPU workers; every method takes the simulated time ``now``."""

    def __init__(
        self,
        slots: int,
        gpu_workers: int,
        factor: Callable[[int], float] = lambda seq: 1.0,
        partition_seconds: Callable[[int], float] = model.partition_seconds,
        gpu_seconds: float = model.GPU_SECONDS_PER_PARTITION,
    ) -> None:
        self.slots = max(1, slots)
        self._factor = factor
        self._partition_seconds = partition_seconds
        self._gpu_seconds = gpu_seconds
        self.pending: deque[Part] = deque()
        self.synthesizing: dict[Part, tuple[float, float]] = {}  # part -> (start, end)
        self.gpu_queue: deque[Part] = deque()
        self.gpu: list[tuple[Part, float] | None] = [None] * max(1, gpu_workers)
        self._unsynthesized: dict[int, int] = {}
        self._unproved: dict[int, int] = {}
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

    def abort(self, seq: int, now: float) -> list[Part]:
        """Forget job ``seq`` everywhere (its slots free at once); returns its started parts."""
        dropped = [p for p in self.synthesizing if p.seq == seq]
        for part in dropped:
            del self.synthesizing[part]
        self.pending = deque(p for p in self.pending if p.seq != seq)
        self.gpu_queue = deque(p for p in self.gpu_queue if p.seq != seq)
        self.gpu = [None if s is not None and s[0].seq == seq else s for s in self.gpu]
        self._unsynthesized.pop(seq, None)
        self._unproved.pop(seq, None)
        self._note_hunger(now)
        return dropped

    def refill(self, now: float) -> list[Event]:
        """Start whatever can start now (after ``abort``)."""
        return self._fill(now)

    def freeze(self) -> None:
        """Stop all progress (SIGINT on the real daemon stops its workers)."""
        self.frozen = True

    # --- time -----------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        if self.frozen:
            return None
        ends = [end for _, end in self.synthesizing.values()]
        ends += [slot[1] for slot in self.gpu if slot is not None]
        return min(ends, default=None)

    def advance(self, now: float) -> list[Event]:
        """Process every completion due by ``now`` in time order, starting work as slots free."""
        events: list[Event] = []
        while (t := self.next_deadline()) is not None and t <= now:
            events += self._complete_at(t)
            events += self._fill(t)
        self.clock = max(self.clock, now)
        return events

    # --- internals ------------------------------------------------------------------------
    def _complete_at(self, t: float) -> list[Event]:
        events: list[Event] = []
        for part in sorted(p for p, (_, end) in self.synthesizing.items() if end == t):
            start, _ = self.synthesizing.pop(part)
            events.append(Synthesized(t, part, t - start))
            self.gpu_queue.append(part)
            self._unsynthesized[part.seq] -= 1
            if self._unsynthesized[part.seq] == 0:
                events.append(JobSynthesized(t, part.seq))
        for worker, slot in enumerate(self.gpu):
            if slot is not None and slot[1] == t:
                self.gpu[worker] = None
                part = slot[0]
                events.append(GpuFinished(t, part, worker, self._gpu_seconds))
                self._unproved[part.seq] -= 1
                if self._unproved[part.seq] == 0:
                    del self._unproved[part.seq], self._unsynthesized[part.seq]
                    events.append(JobProved(t, part.seq))
        return events

    def _fill(self, t: float) -> list[Event]:
        events: list[Event] = []
        if self.frozen:
            return events
        started: list[Part] = []
        while self.pending and len(self.synthesizing) + len(started) < self.slots:
            started.append(self.pending.popleft())
        if started:
            active = len(self.synthesizing) + len(started)
            base = self._partition_seconds(active)
            for part in started:
                seconds = base * self._factor(part.seq)
                self.synthesizing[part] = (t, t + seconds)
                events.append(Started(t, part, active, seconds))
        for worker, slot in enumerate(self.gpu):
            if slot is None and self.gpu_queue:
                part = self.gpu_queue.popleft()
                self.gpu[worker] = (part, t + self._gpu_seconds)
                events.append(GpuStarted(t, part, worker))
        self._note_hunger(t)
        return events

    def _note_hunger(self, t: float) -> None:
        if self.pending or len(self.synthesizing) >= self.slots:
            self.hungry_since = None
        elif self.hungry_since is None:
            self.hungry_since = t


def simulate_closed_loop(
    slots: int, gpu_workers: int, concurrency: int, proofs: int
) -> list[float]:
    """Completion times of ``proofs`` PoRep proofs from a client that keeps ``concurrency`` in
    flight, submitting the next as soon as one completes (all at t=0 to begin with)."""
    pipe = Pipeline(slots, gpu_workers)
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
