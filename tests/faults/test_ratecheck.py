"""The fault matrix's rate check (ratecheck) against synthetic daemon records: it passes a
supervisor that reports the daemon's capacity, and fails a skewed measurement, a wrong estimator
and a supervisor whose lateness left the daemon idle, however loaded the machine was."""

from __future__ import annotations

import ast
import heapq
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults import ratecheck
from faults.ratecheck import ClientView, Reported, judge, rate_per_hour, replay

from cuzk_supervisor.sim.daemon.logfmt import DaemonLog
from cuzk_supervisor.sim.daemon.pipeline import (
    Event,
    JobProved,
    Pipeline,
    Synthesized,
    simulate_closed_loop,
)
from cuzk_supervisor.sim.daemon.timeline import JobRecord, JobTimes, Timeline, read_timeline

SCALE = 200.0
ORIGIN = 1_000_000.0


@dataclass(frozen=True)
class Run:
    jobs: list[JobRecord]
    views: dict[str, ClientView]
    bench: set[str]
    stamps: list[float]
    """When the client stamped each completion (``min(heard, landed + total)``), ascending."""
    started: float
    """When the client submitted its first proof (Unix time)."""

    def reported(self, rate: float | None = None, held: int = 2) -> Reported:
        """The report of an honest estimator (the slope of the stamps), or ``rate``."""
        honest = rate_per_hour([(t - ORIGIN) * SCALE for t in self.stamps])
        value = honest if rate is None else rate
        return Reported(value, len(self.stamps), self.stamps[-1] - self.stamps[0], held)

    def check(self, rate: float | None = None) -> list[str]:
        return judge(self.jobs, self.views, self.bench, self.reported(rate)).problems


def bench_run(
    *,
    proofs: int = 8,
    held: int = 2,
    slots: int = 12,
    react_s: float = 0.003,
    answer_late_s: float = 0.001,
    land_s: float = 0.003,
) -> Run:
    """A closed-loop bench as the simulated daemon records it and a client stamps it: ``held``
    proofs kept submitted, ``react_s`` real seconds from an answer to the next submission
    entering the pipeline, ``answer_late_s`` the daemon's own lateness in answering, ``land_s``
    how long a submission takes to land."""
    pipe = Pipeline(slots, 2)
    arrivals: list[tuple[float, int, int | None]] = [(100.0, seq, None) for seq in range(held)]
    heapq.heapify(arrivals)
    admitted: dict[int, tuple[float, int | None]] = {}
    done: dict[int, float] = {}
    while len(done) < proofs:
        deadline = pipe.next_deadline()
        if arrivals and (deadline is None or arrivals[0][0] <= deadline):
            at, seq, reply_to = heapq.heappop(arrivals)
            admitted[seq] = (at, reply_to)
            events = pipe.submit(seq, at)
        else:
            assert deadline is not None
            events = pipe.advance(deadline)
        for event in events:
            if isinstance(event, JobProved):
                done[event.seq] = event.at
                if len(admitted) + len(arrivals) < proofs:
                    answered = event.at + answer_late_s * SCALE
                    heapq.heappush(
                        arrivals, (answered + react_s * SCALE, len(admitted) + len(arrivals),
                                   event.seq))  # fmt: skip
    jobs, views, stamps = [], {}, []
    for seq, (at, reply_to) in sorted(admitted.items()):
        answered = done[seq] + answer_late_s * SCALE
        times = JobTimes(seq, f"job-{seq}", "porep-c2", "completed", at, at, reply_to, at,
                         done[seq], answered, 0.0)  # fmt: skip
        job = JobRecord(1, times, SCALE, slots, 2, ORIGIN)
        landed, heard = job.unix(at) + land_s, job.unix(answered) + 0.001
        stamps.append(min(heard, landed + (done[seq] - at) / SCALE))
        jobs.append(job)
        views[times.job_id] = ClientView(landed=landed, heard=heard)
    return Run(jobs, views, set(views), sorted(stamps), ORIGIN + 100.0 / SCALE - land_s)


def model_rate(workers: int, held: int, proofs: int) -> float:
    return rate_per_hour(simulate_closed_loop(workers, 2, held, proofs))


@pytest.mark.parametrize(("workers", "held", "proofs"), [(12, 2, 6), (2, 2, 6), (5, 3, 12)])
def test_a_prompt_supervisor_passes_and_the_truth_is_the_model(
    workers: int, held: int, proofs: int
) -> None:
    run = bench_run(slots=workers, held=held, proofs=proofs)
    verdict = judge(run.jobs, run.views, run.bench, run.reported(held=held))
    assert verdict.problems == []
    assert verdict.truth == pytest.approx(model_rate(workers, held, proofs), rel=0.01)
    assert verdict.idle_s == 0.0  # the synthetic record has none


def test_the_replay_as_it_ran_reproduces_the_daemons_completions() -> None:
    run = bench_run(proofs=8, react_s=0.04, answer_late_s=0.02)
    assert replay(run.jobs) == {j.times.seq: pytest.approx(j.times.completed_s) for j in run.jobs}


def test_at_capacity_every_submission_enters_as_the_job_it_followed_completes() -> None:
    """A supervisor 300 ms late on every submission: at capacity the same jobs complete as a
    prompt one's do (the model's closed loop)."""
    late = bench_run(proofs=8, react_s=0.3)
    capacity = replay(late.jobs, at_capacity=True)
    prompt = simulate_closed_loop(12, 2, 2, 8)  # from 0: the synthetic bench starts at 100
    assert sorted(capacity.values()) == pytest.approx([100 + t for t in prompt])


def admitted_at_synthesis_ends(seed: int, path: Path) -> None:
    """A daemon's timeline in which, by chance, jobs are admitted at the instant a batch of
    partitions finished synthesis: the engine admits at ``max(arrival, pipeline clock)``, so a job
    that arrived while the loop ran that completion's timer enters at its exact time."""
    rng = random.Random(seed)
    pipe = Pipeline(12, 2)
    timeline = Timeline(path, DaemonLog("off"))
    timeline.start(time_scale=SCALE, synthesis_slots=12, gpu_workers=2)
    admitted: dict[int, float] = {}
    done: dict[int, float] = {}
    synthesis_ends: set[float] = set()

    def submit(at: float) -> None:
        admitted[len(admitted)] = at
        note(pipe.submit(len(admitted) - 1, at))

    def note(events: list[Event]) -> None:
        for event in events:
            if isinstance(event, JobProved):
                done[event.seq] = event.at
            elif isinstance(event, Synthesized):
                synthesis_ends.add(event.at)

    start = 100 + rng.random()
    submit(start)
    submit(start)
    while len(admitted) < 10:
        deadline = pipe.next_deadline()
        if deadline is None:
            submit(pipe.clock + rng.random())
            continue
        note(pipe.advance(deadline))
        if deadline in synthesis_ends and rng.random() < 0.5:
            submit(deadline)
    while (deadline := pipe.next_deadline()) is not None:
        note(pipe.advance(deadline))
    for seq, at in admitted.items():
        timeline.job(JobTimes(seq, f"job-{seq}", "porep-c2", "completed", at, at, None, at,
                              done[seq], done[seq], 0.0))  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_a_job_admitted_as_partitions_finish_replays_from_the_timeline(
    seed: int, tmp_path: Path
) -> None:
    """The fault matrix once failed the replay's precondition on a loaded machine: the timeline
    rounded its times to the microsecond, so a job admitted at the very instant partitions
    finished could replay just before that completion, start with them, and change every later
    time. Written and read back through the daemon's own timeline file, the replay must
    reproduce it."""
    admitted_at_synthesis_ends(seed, tmp_path / "timeline.jsonl")
    jobs = sorted(read_timeline(tmp_path / "timeline.jsonl"), key=lambda j: j.times.seq)
    assert replay(jobs) == {j.times.seq: j.times.completed_s for j in jobs}


@pytest.mark.parametrize("skew", [0.03, -0.03, 0.25, -0.25])
def test_a_skewed_measurement_fails(skew: float) -> None:
    run = bench_run()
    honest = run.reported().rate
    assert run.check() == []
    (problem,) = run.check(honest * (1 + skew))
    assert "against the daemon's capacity" in problem


def test_a_deliberately_wrong_estimator_is_caught() -> None:
    """Completions over the time since the first submission (the fill counted as if it were
    throughput, the old bench script's arithmetic): the oracle knows the capacity without the
    product's estimator, and says it is wrong."""
    run = bench_run(slots=5, held=2, proofs=8)
    wrong = len(run.stamps) / (run.stamps[-1] - run.started) * 3600 / SCALE
    (problem,) = run.check(wrong)
    assert "against the daemon's capacity" in problem


def test_a_supervisor_whose_lateness_left_the_daemon_idle_fails() -> None:
    """60 ms late on every submission, two proofs held and none queued ahead: the daemon sat
    idle for want of them; reporting what it delivered is reporting the supervisor, not the
    machine."""
    run = bench_run(react_s=0.06)
    (problem,) = run.check()
    assert "against the daemon's capacity" in problem


def test_a_loaded_machine_is_no_excuse_and_a_queue_ahead_needs_none() -> None:
    """The daemon answering 80 ms late every time: with two proofs held the next submission
    comes too late and the daemon idles (fails, whatever the load that made it late); with
    one more queued ahead it never waits and what it delivered is its capacity (passes)."""
    assert bench_run(answer_late_s=0.08, slots=10).check() != []
    fed = bench_run(answer_late_s=0.08, slots=10, held=3)
    verdict = judge(fed.jobs, fed.views, fed.bench, fed.reported(held=3))
    assert verdict.problems == []
    assert verdict.delivered == pytest.approx(verdict.truth, rel=1e-6)


def test_the_oracle_computes_its_truth_without_the_products_core() -> None:
    tree = ast.parse(Path(ratecheck.__file__).read_text())
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m.startswith("cuzk_supervisor.core")], modules
