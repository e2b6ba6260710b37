"""Judge a reported bench rate against the simulated daemon's own capacity for the same proofs.

The simulated daemon's pipeline runs at exact simulated times whatever the machine's load
(``cuzk_supervisor.sim.daemon.timeline``), and it records, per job, when it arrived, entered the
pipeline, completed and was answered, and which earlier answer its submission followed
(``reply_to``: a client keeping N proofs submitted sends one for each answer). So the pipeline
can be replayed (``sim.pipeline.Pipeline``):

- **as it ran**, every job entering when it did, which must give the daemon's own completions
  (else the record cannot be trusted and the verdict says so);
- **at capacity**: every job that followed an answer enters the instant the job it followed
  *completed* (not when it was answered, nor when the client reacted): the daemon never waits
  for a client, as curio keeps it fed in the field. The fill (the jobs that followed no answer)
  enters when it did.

**The truth** is the steady rate, at capacity, of the bench's completions the report is about
(the ``proofs`` consecutive completions whose span, as the client stamped them, is the reported
``interval_s``): the least-squares slope of their completion times against their count, computed
here (this module imports nothing of ``cuzk_supervisor.core``: an oracle that borrowed the
product's estimator would share its mistakes). The reported rate must be within
``RATE_TOLERANCE`` of it: a fixed band, never widened by what the product says of itself (its
stated uncertainty, its loop lag) nor by the machine's load. A supervisor that leaves the daemon
idle (late submissions that a queue ahead did not cover) reports less than the capacity unless
it takes that idle out; a supervisor whose stamps are late or whose estimator is wrong reports
something else: both fail.

What the daemon delivered (the window's steady rate as it ran) and the idle it recorded
(``starved_s``: a synthesis slot free with nothing waiting, after the answer was given) are in
the verdict's description, to tell the two failures apart.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cuzk_supervisor.sim.daemon.pipeline import Event, JobProved, Pipeline
from cuzk_supervisor.sim.daemon.timeline import JobRecord

HOUR_S = 3600.0
RATE_TOLERANCE = 0.02
"""The reported rate's largest error against the daemon's capacity, as a fraction."""
POREP = "porep-c2"


@dataclass(frozen=True, slots=True)
class ClientView:
    """What the supervisor's own log says about one proof, as Unix times."""

    landed: float | None = None
    """The daemon had the job by then: the latest SubmitProof answered (``proof.submitted``)
    or was cut with the job landed (``proof.submit_uncertain``, then found by its await)."""
    heard: float | None = None
    """The result was seen (``proof.completed``)."""


@dataclass(frozen=True, slots=True)
class Reported:
    """The rate as reported (``bench.result``): simulated proofs per hour and its measurement."""

    rate: float
    proofs: int
    interval_s: float
    """Real seconds from the first to the last completion counted, on the client's clock."""
    concurrency: int = 2


@dataclass(frozen=True, slots=True)
class Proof:
    """A window's proof: the daemon's record and when the client stamped its completion."""

    job: JobRecord
    stamp: float
    """When a client stamping ``min(heard, landed + total_ms)`` puts it (Unix time): only to
    find the window the report is about."""


@dataclass
class Verdict:
    reported: float
    band: float = RATE_TOLERANCE
    truth: float = 0.0
    """The window's steady rate with the daemon fed at once (its capacity)."""
    delivered: float = 0.0
    """The window's steady rate as the daemon ran it."""
    idle_s: float = 0.0
    """Real seconds the daemon recorded idle for want of a submission, before the window's jobs."""
    window: list[Proof] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        return self.reported / self.truth - 1 if self.truth else float("nan")

    def describe(self) -> str:
        lines = [
            f"reported {self.reported:.2f}/h, the daemon's capacity {self.truth:.2f}/h "
            f"({self.error:+.1%}, at most +-{self.band:.0%}); it delivered "
            f"{self.delivered:.2f}/h, idle {self.idle_s * 1000:.0f} ms for want of a submission"
        ]
        for p in self.window:
            t, scale = p.job.times, p.job.time_scale
            lines.append(
                f"  {t.job_id[:8]} pid {p.job.pid} arrived {t.arrived_s:8.2f} completed "
                f"{_done(p.job):8.2f} answered +{_answer_late_s(p.job) * 1e3:.1f} ms, starved "
                f"{t.starved_s / scale * 1e3:.1f} ms, stamped "
                f"{p.stamp - p.job.unix(_done(p.job)):+.3f} s from it"
            )
        return "\n".join([*self.problems, *lines])


def _done(job: JobRecord) -> float:
    """When an ended job ended (simulated); infinity for one still running."""
    done = job.times.completed_s
    return float("inf") if done is None else done


def _answer_late_s(job: JobRecord) -> float:
    t = job.times
    if t.answered_s is None or t.completed_s is None:
        return 0.0
    return (t.answered_s - t.completed_s) / job.time_scale


def seconds_per_proof(times: Sequence[float]) -> float | None:
    """The least-squares slope of ``times`` (ascending) against their count; None without two
    distinct times."""
    n = len(times)
    if n < 2:
        return None
    mean_k, mean_t = (n - 1) / 2, sum(times) / n
    sxx = sum((k - mean_k) ** 2 for k in range(n))
    sxy = sum((k - mean_k) * (t - mean_t) for k, t in enumerate(times))
    return sxy / sxx if sxy > 0 else None


def rate_per_hour(simulated: Sequence[float]) -> float:
    """Proofs per simulated hour from completion times in simulated seconds."""
    spp = seconds_per_proof(sorted(simulated))
    return HOUR_S / spp if spp is not None else 0.0


def _stamp(job: JobRecord, view: ClientView | None) -> float:
    t = job.times
    candidates = [job.unix(_done(job))]
    if view is not None and view.landed is not None and t.completed_s is not None:
        candidates = [view.landed + (t.completed_s - t.arrived_s) / job.time_scale]
    if view is not None and view.heard is not None:
        candidates.append(view.heard)
    return min(candidates)


def replay(group: Sequence[JobRecord], *, at_capacity: bool = False) -> dict[int, float]:
    """Completion times (simulated, by ``seq``) of one daemon's PoRep jobs replayed in a fresh
    pipeline: as they ran (each job entering when it was admitted), or ``at_capacity`` (a job
    that followed an answer in the group enters the instant the job it followed completed)."""
    first = group[0]
    by_seq = {j.times.seq: j for j in group}
    followers: dict[int, list[JobRecord]] = defaultdict(list)
    arrivals: list[tuple[float, int]] = []
    for job in group:
        trigger = by_seq.get(job.times.reply_to) if job.times.reply_to is not None else None
        if at_capacity and trigger is not None:
            followers[trigger.times.seq].append(job)
        else:
            heapq.heappush(arrivals, (job.times.admitted_s or 0.0, job.times.seq))
    pipe = Pipeline(first.synthesis_slots, first.gpu_workers)
    done: dict[int, float] = {}

    def proved(events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, JobProved):
                done[event.seq] = event.at
                for job in followers[event.seq]:
                    heapq.heappush(arrivals, (event.at, job.times.seq))

    while arrivals or pipe.next_deadline() is not None:
        deadline = pipe.next_deadline()
        if arrivals and (deadline is None or arrivals[0][0] <= deadline):
            at, seq = heapq.heappop(arrivals)
            proved(pipe.submit(seq, at))
        else:
            assert deadline is not None
            proved(pipe.advance(deadline))
    return done


def _daemon_groups(jobs: Sequence[JobRecord], bench: set[str]) -> dict[int, list[JobRecord]]:
    """Each daemon process's bench PoRep jobs that entered the pipeline, in admission order
    (the bench's jobs are alone in it: the settle proof before them has ended)."""
    groups: dict[int, list[JobRecord]] = defaultdict(list)
    for job in jobs:
        t = job.times
        if t.job_id in bench and t.kind == POREP and t.admitted_s is not None:
            groups[job.pid].append(job)
    for group in groups.values():
        group.sort(key=lambda j: j.times.admitted_s or 0.0)
    return groups


def find_window(
    groups: Mapping[int, Sequence[JobRecord]], views: Mapping[str, ClientView], proofs: int,
    interval_s: float,
) -> list[Proof]:  # fmt: skip
    """The ``proofs`` consecutive completions of one daemon's bench jobs whose span, as the
    client stamped them, is closest to ``interval_s`` (empty when there are too few)."""
    best: list[Proof] = []
    best_miss = float("inf")
    for group in groups.values():
        stamped = sorted(
            (Proof(j, _stamp(j, views.get(j.times.job_id))) for j in group if j.times.ok),
            key=lambda p: p.stamp,
        )
        for start in range(len(stamped) - proofs + 1):
            window = stamped[start : start + proofs]
            miss = abs(window[-1].stamp - window[0].stamp - interval_s)
            if miss < best_miss:
                best, best_miss = window, miss
    return best


def judge(
    jobs: Sequence[JobRecord],
    views: Mapping[str, ClientView],
    bench: set[str],
    reported: Reported,
    band: float = RATE_TOLERANCE,
) -> Verdict:
    """The reported rate against the daemon's capacity over the same proofs (the module's
    text); ``bench``: the job ids submitted in the bench; ``band``: the largest error allowed
    (a fixed fraction)."""
    verdict = Verdict(reported.rate, band=band)
    if reported.proofs < 2:
        verdict.problems.append(f"a rate from {reported.proofs} proof(s) is no steady rate")
        return verdict
    groups = _daemon_groups(jobs, bench)
    window = find_window(groups, views, reported.proofs, reported.interval_s)
    verdict.window = window
    if not window:
        verdict.problems.append(
            f"the daemon completed no {reported.proofs} consecutive bench proofs"
        )
        return verdict
    group = groups[window[0].job.pid]
    scale = window[0].job.time_scale
    seqs = [p.job.times.seq for p in window]
    verdict.delivered = rate_per_hour([_done(p.job) for p in window])
    verdict.idle_s = sum(p.job.times.starved_s for p in window) / scale
    as_ran = replay(group)
    off = [
        s for s, p in zip(seqs, window, strict=True) if abs(as_ran.get(s, -1) - _done(p.job)) > 1e-3
    ]
    if off:
        verdict.problems.append(
            f"the pipeline replayed from the daemon's record does not give its completions "
            f"(seq {off}): its capacity cannot be told"
        )
        return verdict
    capacity = replay(group, at_capacity=True)
    verdict.truth = rate_per_hour([capacity[s] for s in seqs])
    if abs(verdict.error) > band:
        verdict.problems.append(
            f"reported {reported.rate:.2f}/h against the daemon's capacity {verdict.truth:.2f}/h "
            f"over the same proofs ({verdict.error:+.1%}, at most +-{band:.0%})"
        )
    return verdict
