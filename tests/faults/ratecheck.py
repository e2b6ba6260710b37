"""Judge a reported bench rate against the simulated daemon's own record of the same proofs.

The simulated daemon's pipeline runs at exact simulated times whatever the machine's load
(``cuzk_supervisor.sim.daemon.timeline``), so its record says what it really delivered and when it
sat idle for want of a submission. Comparing the supervisor's rate with a model of a perfect client
instead blames the supervisor for everything real time does to a batch that lasts 0.6 s at the
fault matrix's time scale (a few tens of milliseconds are several per cent of it). :func:`judge`
asks the two questions the rate is for (issue 10: it must be the pipeline's steady throughput):

(a) **Measurement.** Is the reported rate the steady rate of the proofs the daemon completed?
    The window is found among the bench's completions (the ``proofs`` consecutive ones whose span,
    as the client stamped them, is the reported ``interval_s``); its steady rate on the daemon's
    clock is the truth, less the intervals a late submission held up (issue 32: a proof that
    entered the daemon more than a tenth of an interval after the completion it replaced, where
    the interval ending at its own completion is longer than usual: the product's
    ``Stretch.breaks``, here from the daemon's record of arrivals and completions). The client
    stamps a completion at ``min(heard, landed + total_ms)``, the daemon's ``total_ms`` counting
    from the SubmitProof's arrival: later than the truth by
    ``U = min(landed - arrived, heard - completed)``, which no client can know (how long its
    submission took to land, how late it heard). The reported rate must lie within the rates of
    the true completions each moved later by anything in ``[0, U]``, widened by
    ``RATE_TOLERANCE``. On a quiet machine U is a few milliseconds and the band is the truth.
    Which intervals a late submission held up is itself judged on such times (a submission
    near the cut-off is late on one clock and prompt on the other): the band spans the held-up
    intervals read from the daemon's completions and from the client's stamps.

(b) **Feeding.** Did the supervisor cost the rate by leaving the pipeline idle? The daemon records,
    per job, which answer the submission followed (``reply_to``: a client keeping N proofs in
    flight submits one for each answer) and when it entered the pipeline. The pipeline is
    replayed from the record as a closed loop (``sim.daemon.pipeline.Pipeline``; with the recorded
    reactions it must reproduce the daemon's completions), then again with every reaction capped
    at an allowance for scheduling (``NOISE_S``, plus ``NOISE_FACTOR`` times how slow the machine
    was then, (c)). The window's rate
    in the second replay is what a prompt supervisor would have measured; the rate the daemon
    delivered may differ from it by at most ``FEEDING_COST_MAX`` (a late submission can bend a
    short window either way). The timeline's ``starved_s`` (how long a synthesis slot was free
    with nothing waiting after that answer) shows where the idle was.

(c) The machine being slow is neither: the daemon answering late delays the next submission but
    is kept in the prompt replay (reactions count from the answer), and the machine's lateness
    widens the band of (a) and the allowance of (b). Its lateness is seen from both sides: the
    daemon's worst answering lateness in the window, and the supervisor's own, the worst
    lateness of its event loop's wake-ups while the stretch ran (``bench.stretch_done``
    ``loop_lag_max_ms``): a starved supervisor is a loaded machine, and it says so in its log.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cuzk_supervisor.core.bench import Stretch, steady_rate_per_s
from cuzk_supervisor.sim.daemon.pipeline import Event, JobProved, Pipeline
from cuzk_supervisor.sim.daemon.timeline import JobRecord

HOUR_S = 3600.0
RATE_TOLERANCE = 0.02
"""(a): beyond the band of what the client cannot know (rounding, the two regressions)."""
NOISE_S = 0.02
"""(b): real seconds per submission that carrying an answer to the client and the next
submission back may take on a loaded machine (transport, two processes' scheduling)."""
NOISE_FACTOR = 2.0
"""(b): the allowance grows by this many times the machine's lateness: the worse of the daemon's
answering lateness in the window and the supervisor's own loop lag (the supervisor and the
transport share the loaded machine with the daemon)."""
FEEDING_COST_MAX = 0.02
"""(b): how far the rate the daemon delivered may be from a prompt supervisor's."""
EXACT_BAND_MAX = 12
"""Windows up to this many completions get the band from every corner of the box (2^n)."""
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
    """A window's proof: the daemon's record and what the client could not know about it."""

    job: JobRecord
    stamp: float
    """When the client's method stamps its completion (Unix time)."""
    unknown_s: float
    """U: how much later than the truth that is, at most (real seconds)."""
    reaction: str
    """How soon after the answer it followed it was submitted ("fill": it followed none)."""

    @property
    def completed(self) -> float:
        return self.job.unix(_done(self.job))


@dataclass
class Verdict:
    reported: float
    truth: float = 0.0
    """(a): the window's steady rate on the daemon's clock, less the intervals held up."""
    delivered: float = 0.0
    """(b): the window's rate as the daemon delivered it (every interval)."""
    band: tuple[float, float] = (0.0, 0.0)
    prompt: float = 0.0
    """(b): the window's rate replayed with every reaction within the allowance."""
    allowance_s: float = 0.0
    window: list[Proof] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        return self.reported / self.truth - 1 if self.truth else float("nan")

    @property
    def feeding_cost(self) -> float:
        """How far the delivered rate is below a prompt supervisor's (negative: above)."""
        return 1 - self.delivered / self.prompt if self.prompt else 0.0

    def describe(self) -> str:
        lines = [
            f"reported {self.reported:.2f}/h, the daemon's own {self.truth:.2f}/h "
            f"(delivered {self.delivered:.2f}/h) "
            f"({self.error:+.1%}), band {self.band[0]:.2f}..{self.band[1]:.2f}; a prompt "
            f"supervisor {self.prompt:.2f}/h (feeding cost {self.feeding_cost:.1%}, allowance "
            f"{self.allowance_s * 1000:.0f} ms a submission)"
        ]
        for p in self.window:
            t, scale = p.job.times, p.job.time_scale
            lines.append(
                f"  {t.job_id[:8]} pid {p.job.pid} arrived {t.arrived_s:8.2f} completed "
                f"{_done(p.job):8.2f} answered +{_answer_late_s(p.job) * 1e3:.1f} ms, starved "
                f"{t.starved_s / scale * 1e3:.1f} ms, unknown {p.unknown_s * 1e3:.1f} ms, "
                f"submitted {p.reaction}"
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


def _reaction_ms(job: JobRecord, group: Mapping[int, JobRecord]) -> str:
    """How long after the answer it followed the job entered the pipeline (real ms)."""
    t = job.times
    trigger = group.get(t.reply_to) if t.reply_to is not None else None
    if trigger is None or trigger.times.answered_s is None:
        return "fill"
    reaction = ((t.admitted_s or 0.0) - trigger.times.answered_s) / job.time_scale
    return f"{reaction * 1e3:.1f} ms after seq {trigger.times.seq}'s answer"


def _proof(job: JobRecord, view: ClientView | None, reaction: str) -> Proof:
    t = job.times
    completed = job.unix(_done(job))
    candidates = []
    if view is not None and view.landed is not None:
        assert t.completed_s is not None, f"a proof is a completed job: {t}"
        candidates.append(view.landed + (t.completed_s - t.arrived_s) / job.time_scale)
    if view is not None and view.heard is not None:
        candidates.append(view.heard)
    stamp = min(candidates) if candidates else completed
    return Proof(job, stamp, max(0.0, stamp - completed), reaction)


def _rate_per_hour(
    times: Sequence[float], scale: float, breaks: frozenset[int] = frozenset()
) -> float:
    """Simulated proofs per hour from completion times in real seconds."""
    rate = steady_rate_per_s(sorted(times), breaks)
    return rate * HOUR_S / scale if rate is not None else 0.0


def held_up(
    group: Sequence[JobRecord],
    window: Sequence[Proof],
    concurrency: int,
    views: Mapping[str, ClientView] | None = None,
) -> frozenset[int]:
    """The window's intervals a late submission held up, read as the product reads its own
    stamps: from the daemon's own record (its completions and when each job arrived), or, with
    ``views``, with each completion as the client stamped it."""
    completed = [j for j in group if j.times.ok]

    def done_at(job: JobRecord) -> float:
        if views is None:
            return job.unix(_done(job))
        return _proof(job, views.get(job.times.job_id), "").stamp

    completed.sort(key=done_at)
    stretch = Stretch(workers=1, concurrency=concurrency, started_at=0.0)
    for at in sorted(job.unix(job.times.arrived_s) for job in group):
        stretch = stretch.submitted_one(at)
    for job in completed:
        stretch = stretch.completed(done_at(job))
    first = [j.times.seq for j in completed].index(window[0].job.times.seq)
    return frozenset(i - first for i in stretch.breaks if first < i < first + len(window))


def rate_band(window: Sequence[Proof], breaks: frozenset[int] = frozenset()) -> tuple[float, float]:
    """The lowest and highest rate of the window's true completions, each moved later by
    anything from 0 to its ``unknown_s``: the rates a client could honestly have measured."""
    scale = window[0].job.time_scale
    truth = [p.completed for p in window]
    shifts = [p.unknown_s for p in window]
    corners: Iterable[Sequence[int]]
    if len(window) <= EXACT_BAND_MAX:
        corners = itertools.product((0, 1), repeat=len(window))
    else:  # larger windows: the two corners that move one half against the other
        half = len(window) // 2
        corners = iter([[int(i < half) for i in range(len(window))],
                        [int(i >= half) for i in range(len(window))]])  # fmt: skip
    rates = [
        _rate_per_hour(
            [t + s * on for t, s, on in zip(truth, shifts, corner, strict=True)], scale, breaks
        )
        for corner in corners
    ]
    return min(rates), max(rates)


def replay(group: Sequence[JobRecord], reaction_cap_s: float | None = None) -> dict[int, float]:
    """Completion times (simulated, by ``seq``) of one daemon's PoRep jobs replayed as a closed
    loop in a fresh pipeline. A job that replied to an answer in the group (``reply_to``) is
    submitted its recorded reaction time after that answer, capped at ``reaction_cap_s``; the
    others (the fill of a stretch) when they were admitted. With no cap this must give the
    daemon's own completions; with one, what a client that always reacted within it would have
    seen (the daemon's lateness in answering kept: that is the machine's)."""
    first = group[0]
    by_seq = {j.times.seq: j for j in group}
    followers: dict[int, list[JobRecord]] = defaultdict(list)
    arrivals: list[tuple[float, int]] = []
    for job in group:
        trigger = by_seq.get(job.times.reply_to) if job.times.reply_to is not None else None
        if trigger is not None and trigger.times.answered_s is not None:
            followers[trigger.times.seq].append(job)
        else:
            heapq.heappush(arrivals, (job.times.admitted_s or 0.0, job.times.seq))

    def reaction(job: JobRecord, trigger: JobRecord) -> float:
        answered = trigger.times.answered_s or 0.0
        late = max(0.0, (job.times.admitted_s or 0.0) - answered)
        return late if reaction_cap_s is None else min(late, reaction_cap_s)

    pipe = Pipeline(first.synthesis_slots, first.gpu_workers)
    done: dict[int, float] = {}

    def proved(events: Sequence[Event]) -> None:
        for event in events:
            if not isinstance(event, JobProved):
                continue
            done[event.seq] = event.at
            trigger = by_seq[event.seq]
            t = trigger.times
            answer_late = (t.answered_s or 0.0) - (t.completed_s or 0.0)
            for job in followers[event.seq]:
                heapq.heappush(
                    arrivals, (event.at + answer_late + reaction(job, trigger), job.times.seq)
                )

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
        completed = [j for j in group if j.times.ok]
        if not completed:
            continue
        jobs = {j.times.seq: j for j in group}
        stamped = sorted(
            (_proof(j, views.get(j.times.job_id), _reaction_ms(j, jobs)) for j in completed),
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
    *,
    feeding: bool = True,
    client_lag_s: float = 0.0,
) -> Verdict:
    """(a) and, with ``feeding``, (b) of the module's docstring; ``bench``: the job ids
    submitted in the bench; ``client_lag_s``: the supervisor's worst loop lag in the bench."""
    verdict = Verdict(reported.rate)
    if reported.proofs < 2:
        verdict.problems.append(f"(a) a rate from {reported.proofs} proof(s) is no steady rate")
        return verdict
    groups = _daemon_groups(jobs, bench)
    window = find_window(groups, views, reported.proofs, reported.interval_s)
    verdict.window = window
    if not window:
        verdict.problems.append(
            f"(a) the daemon completed no {reported.proofs} consecutive bench proofs"
        )
        return verdict
    scale = window[0].job.time_scale
    group = groups[window[0].job.pid]
    breaks = held_up(group, window, reported.concurrency)
    verdict.truth = _rate_per_hour([p.completed for p in window], scale, breaks)
    verdict.delivered = _rate_per_hour([p.completed for p in window], scale)
    # Which intervals were held up is judged on times the client cannot know exactly: a
    # submission near the cut-off (a tenth of an interval) may be late on the daemon's clock and
    # prompt on the client's, or the other way round. Both readings, and their meet and join,
    # are honest measurements.
    seen = held_up(group, window, reported.concurrency, views)
    bands = [rate_band(window, b) for b in {breaks, seen, breaks & seen, breaks | seen}]
    low, high = verdict.band = min(b[0] for b in bands), max(b[1] for b in bands)
    if not low * (1 - RATE_TOLERANCE) <= reported.rate <= high * (1 + RATE_TOLERANCE):
        verdict.problems.append(
            f"(a) measurement: reported {reported.rate:.2f}/h is outside {low:.2f}..{high:.2f}/h "
            f"(the daemon's own {verdict.truth:.2f}/h, moved by what the client cannot know) "
            f"+-{RATE_TOLERANCE:.0%}"
        )
    if feeding:
        _judge_feeding(verdict, groups[window[0].job.pid], client_lag_s)
    return verdict


def _judge_feeding(verdict: Verdict, group: Sequence[JobRecord], client_lag_s: float) -> None:
    window = verdict.window
    scale = window[0].job.time_scale
    late = max(client_lag_s, *(_answer_late_s(p.job) for p in window))
    verdict.allowance_s = NOISE_S + NOISE_FACTOR * late
    seqs = [p.job.times.seq for p in window]
    jobs = {j.times.seq: j for j in group}
    as_recorded = replay(group)
    off = [s for s in seqs if abs(as_recorded.get(s, -1.0) - _done(jobs[s])) > 1e-3]
    if off:
        verdict.problems.append(
            "(b) the pipeline replayed from the daemon's record does not give its completions "
            f"(seq {off}): cannot tell what a prompt supervisor would have measured"
        )
        return
    prompt = replay(group, reaction_cap_s=verdict.allowance_s * scale)
    verdict.prompt = _rate_per_hour([prompt[s] / scale for s in seqs], scale)
    if abs(verdict.feeding_cost) > FEEDING_COST_MAX:
        verdict.problems.append(
            f"(b) feeding: reacting to each answer within {verdict.allowance_s * 1000:.0f} ms, "
            f"the supervisor would have measured {verdict.prompt:.2f}/h over the same proofs; the "
            f"daemon delivered {verdict.delivered:.2f}/h ({-verdict.feeding_cost:+.1%}, at most "
            f"+-{FEEDING_COST_MAX:.0%}): it left the pipeline idle"
        )
