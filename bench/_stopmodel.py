"""A pure, seeded model of a proving pipeline and the bench client, for ``bench/stop_stats.py``.

The pipeline: ``workers`` partition slots synthesize the 10 partitions of each PoRep proof,
first come first served across proofs; a synthesized partition queues for one of
``gpu_workers`` GPU workers (``gpu_s`` each); a proof completes when its 10 partitions are
through. A partition synthesizes in ``seconds_per_proof * workers / 10`` (so a full pipeline
proves one proof every ``seconds_per_proof``, the reference table's figure) times the proof's
``slowdown`` (a throttle, a drift) times a seeded noise of ``noise`` (relative standard
deviation, per partition). It is a statistical model (noise, drift, late hearing), written here
so that the simulator's own timing model (``sim.daemon.pipeline``) can change under it without
moving these figures; like it, the partition rounds make completions come in lumps where the
workers do not divide the 10 partitions.

The client is the product's own decision code: :func:`~cuzk_supervisor.core.bench.
next_submission` at every completion heard (the lifecycle's ``StretchRun`` loop, in virtual
time), each completion stamped when the daemon finished it (the lifecycle's best clock), each
submission when it went in (``Stretch.fed``: the core tells the late ones), and
:func:`~cuzk_supervisor.core.benchreport.choose_measurement` at the end. ``late`` makes the
client hear a share of the completions late (a connection reset, a starved supervisor): the
next proof then goes in that much later, as it would.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cuzk_supervisor.core.bench import BenchPolicy, Stretch, next_submission
from cuzk_supervisor.core.benchreport import RateMeasurement, choose_measurement

PARTITIONS = 10


def steady_everywhere(seq: int) -> float:
    return 1.0


@dataclass(frozen=True)
class Machine:
    workers: int
    seconds_per_proof: float
    noise: float = 0.01
    """Relative standard deviation of each partition's synthesis time."""
    slowdown: Callable[[int], float] = steady_everywhere
    """Synthesis time factor of proof ``seq`` (0-based, in submission order)."""
    gpu_workers: int = 2
    gpu_s: float = 3.0
    late_share: float = 0.0
    """Share of the completions the client hears late."""
    late_most: float = 0.0
    """How late at most, in steady intervals (uniform from 0)."""


@dataclass
class _Pipe:
    machine: Machine
    rng: random.Random
    pending: deque[int] = field(default_factory=deque)
    synth: list[tuple[float, int]] = field(default_factory=list)  # heap (end, seq)
    gpu_queue: deque[int] = field(default_factory=deque)
    gpu: list[tuple[float, int]] = field(default_factory=list)  # heap (end, seq)
    left: dict[int, int] = field(default_factory=dict)

    def submit(self, seq: int, now: float) -> None:
        self.left[seq] = PARTITIONS
        self.pending.extend([seq] * PARTITIONS)
        self._fill(now)

    def _fill(self, now: float) -> None:
        m = self.machine
        base = m.seconds_per_proof * m.workers / PARTITIONS
        while self.pending and len(self.synth) < m.workers:
            seq = self.pending.popleft()
            noise = max(0.2, 1.0 + m.noise * self.rng.gauss(0.0, 1.0))
            heapq.heappush(self.synth, (now + base * m.slowdown(seq) * noise, seq))
        while self.gpu_queue and len(self.gpu) < m.gpu_workers:
            heapq.heappush(self.gpu, (now + m.gpu_s, self.gpu_queue.popleft()))

    def next_at(self) -> float | None:
        ends = [h[0][0] for h in (self.synth, self.gpu) if h]
        return min(ends) if ends else None

    def step(self) -> tuple[float, int | None]:
        """Advance to the next event; (its time, the proof it completed or None)."""
        synth_end = self.synth[0][0] if self.synth else float("inf")
        gpu_end = self.gpu[0][0] if self.gpu else float("inf")
        if synth_end < gpu_end:
            now, seq = heapq.heappop(self.synth)
            self.gpu_queue.append(seq)
            self._fill(now)
            return now, None
        now, seq = heapq.heappop(self.gpu)
        self.left[seq] -= 1
        self._fill(now)
        return now, (seq if self.left[seq] == 0 else None)


@dataclass(frozen=True)
class Outcome:
    stretch: Stretch
    measurement: RateMeasurement
    seconds: float
    """From the stretch's start to its last completion (its verdict)."""
    last_seq: int
    """The last proof submitted (its slowdown is the one the machine held at the end)."""


def run(machine: Machine, policy: BenchPolicy, seed: int, budget_s: float) -> Outcome:
    """One stretch of the bench against ``machine``, from an idle pipeline at time 0."""
    rng = random.Random(seed)
    pipe = _Pipe(machine, rng)
    stretch = Stretch(workers=machine.workers, concurrency=policy.concurrency, started_at=0.0)
    heard: list[tuple[float, float]] = []  # heap (heard at, done at)

    def fill(stretch: Stretch, now: float) -> Stretch:
        while (decision := next_submission(stretch, now, budget_s, policy)).submit:
            pipe.submit(stretch.submitted, now)
            stretch = stretch.submitted_one(now)
        return stretch.close(decision.reason, decision.stop) if decision.closes else stretch

    stretch = fill(stretch, 0.0)
    while stretch.in_flight:
        at = pipe.next_at()
        if heard and (at is None or heard[0][0] <= at):
            now, done_at = heapq.heappop(heard)
            stretch = fill(stretch.completed(done_at), now)
            continue
        now, proved = pipe.step()
        if proved is not None:
            delay = 0.0
            if machine.late_share and rng.random() < machine.late_share:
                delay = rng.uniform(0.0, machine.late_most) * machine.seconds_per_proof
            heapq.heappush(heard, (now + delay, now))
    measurement = choose_measurement([stretch], policy)
    return Outcome(stretch, measurement, stretch.completions[-1], stretch.submitted - 1)


def steady_rate_per_hour(machine: Machine, factor: float = 1.0, proofs: int = 2000) -> float:
    """The machine's long-run rate with every proof ``factor`` times slower (a client that never
    hears late, concurrency 2): completions 100 to ``proofs`` of one long seeded run."""
    steady = Machine(machine.workers, machine.seconds_per_proof, machine.noise,
                     lambda seq: factor, machine.gpu_workers, machine.gpu_s)  # fmt: skip
    pipe = _Pipe(steady, random.Random(20_240_601))
    done: list[float] = []
    submitted = 2
    pipe.submit(0, 0.0)
    pipe.submit(1, 0.0)
    while len(done) < proofs:
        now, proved = pipe.step()
        if proved is not None:
            done.append(now)
            pipe.submit(submitted, now)
            submitted += 1
    return (len(done) - 100) / (done[-1] - done[99]) * 3600
