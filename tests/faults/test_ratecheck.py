"""The fault matrix's rate check (ratecheck) against synthetic daemon records: it passes an honest
supervisor on a slow machine and fails a skewed measurement or a supervisor that submits late."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults.ratecheck import (
    FEEDING_COST_MAX,
    NOISE_FACTOR,
    NOISE_S,
    ClientView,
    Reported,
    judge,
    replay,
)

from cuzk_supervisor.core.bench import Stretch, steady_rate_per_s
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
    reported: Reported


def bench_run(
    *,
    proofs: int = 4,
    concurrency: int = 2,
    slots: int = 12,
    react_s: float = 0.003,
    answer_late_s: float = 0.001,
    land_s: float = 0.003,
    fill_land_s: float | None = None,
    skew: float = 0.0,
) -> Run:
    """A closed-loop bench as the simulated daemon records it and the supervisor stamps it:
    ``react_s`` real seconds from an answer to the next submission entering the pipeline,
    ``answer_late_s`` the daemon's own lateness in answering, ``land_s`` how long a submission
    takes to land (``fill_land_s`` for the first ``concurrency``), ``skew`` on the report."""
    pipe = Pipeline(slots, 2)
    arrivals: list[tuple[float, int, int | None]] = [
        (100.0, seq, None) for seq in range(concurrency)
    ]
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
    jobs, views, stamps, fed = [], {}, [], []
    for seq, (at, reply_to) in sorted(admitted.items()):
        answered = done[seq] + answer_late_s * SCALE
        times = JobTimes(seq, f"job-{seq}", "porep-c2", "completed", at, at, reply_to, at,
                         done[seq], answered, 0.0)  # fmt: skip
        job = JobRecord(1, times, SCALE, slots, 2, ORIGIN)
        land = fill_land_s if fill_land_s is not None and seq < concurrency else land_s
        landed, heard = job.unix(at) + land, job.unix(answered) + 0.001
        view = ClientView(landed=landed, heard=heard)
        stamps.append(min(heard, landed + (done[seq] - at) / SCALE))
        fed.append(job.unix(at) - land)  # the client launched its submit then
        jobs.append(job)
        views[times.job_id] = view
    # The rate as the product computes it from its stamps and submission times (Stretch.breaks:
    # the intervals a late submission held up are left out).
    stretch = Stretch(workers=slots, concurrency=concurrency, started_at=min(fed))
    for at in sorted(fed):
        stretch = stretch.submitted_one(at)
    for stamp in stamps:
        stretch = stretch.completed(stamp)
    stamps.sort()
    rate = steady_rate_per_s(stamps, stretch.breaks)
    assert rate is not None
    reported = Reported(
        rate * 3600 / SCALE * (1 + skew), proofs, stamps[-1] - stamps[0], concurrency
    )
    return Run(jobs, views, set(views), reported)


def check(run: Run) -> list[str]:
    return judge(run.jobs, run.views, run.bench, run.reported).problems


@pytest.mark.parametrize(("workers", "concurrency", "proofs"), [(12, 2, 4), (2, 2, 6), (5, 3, 12)])
def test_an_honest_prompt_supervisor_passes_and_the_truth_is_the_model(
    workers: int, concurrency: int, proofs: int
) -> None:
    run = bench_run(slots=workers, concurrency=concurrency, proofs=proofs)
    verdict = judge(run.jobs, run.views, run.bench, run.reported)
    assert verdict.problems == []
    model = simulate_closed_loop(workers, 2, concurrency, proofs)
    rate = steady_rate_per_s(model)
    assert rate is not None
    assert verdict.truth == pytest.approx(rate * 3600, rel=0.01)
    assert verdict.feeding_cost == pytest.approx(0, abs=0.005)


def test_the_replay_reproduces_the_daemons_completions() -> None:
    run = bench_run(proofs=8, react_s=0.04, answer_late_s=0.02)
    replayed = replay(run.jobs)
    assert replayed == {j.times.seq: pytest.approx(j.times.completed_s) for j in run.jobs}


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
    """The fault matrix once failed (b)'s precondition on a loaded machine: the timeline rounded
    its times to the microsecond, so a job admitted at the very instant partitions finished could
    replay just before that completion, start with them, and change every later time. Written
    and read back through the daemon's own timeline file, the replay must reproduce it."""
    admitted_at_synthesis_ends(seed, tmp_path / "timeline.jsonl")
    jobs = sorted(read_timeline(tmp_path / "timeline.jsonl"), key=lambda j: j.times.seq)
    assert replay(jobs) == {j.times.seq: j.times.completed_s for j in jobs}


@pytest.mark.parametrize("skew", [0.04, -0.04, 0.25, -0.25])
def test_a_skewed_measurement_fails_a(skew: float) -> None:
    problems = check(bench_run(skew=skew))
    assert [p[:15] for p in problems] == ["(a) measurement"]


def test_a_supervisor_submitting_late_fails_b() -> None:
    """60 ms late on every submission: what the supervisor reports is what the daemon did
    ((a) holds), but the daemon sat idle for want of its submissions."""
    problems = check(bench_run(react_s=0.06))
    assert [p[:11] for p in problems] == ["(b) feeding"]
    assert f"at most +-{FEEDING_COST_MAX:.0%}" in problems[0]


def test_a_supervisor_waiting_out_a_cut_call_fails_b() -> None:
    """A result heard only when a cut await is retried after a backoff (300 ms)."""
    assert [p[:11] for p in check(bench_run(react_s=0.3))] == ["(b) feeding"]


def test_a_starved_supervisor_is_a_loaded_machine_not_a_late_one() -> None:
    """60 ms late on every submission fails (b), unless the supervisor's own loop woke that late
    in the bench (its loop lag): then the machine was starving it, as (c) allows for."""
    run = bench_run(react_s=0.06)
    lagging = judge(run.jobs, run.views, run.bench, run.reported, client_lag_s=0.03)
    assert lagging.problems == []
    assert lagging.allowance_s == pytest.approx(NOISE_S + NOISE_FACTOR * 0.03)
    barely = judge(run.jobs, run.views, run.bench, run.reported, client_lag_s=0.005)
    assert [p[:11] for p in barely.problems] == ["(b) feeding"]


def test_without_the_feeding_check_only_the_measurement_is_judged() -> None:
    """The fault rows whose fault is the transport itself: a late supervisor passes (b) unasked,
    a skewed measurement still fails (a)."""
    late, skewed = bench_run(react_s=0.3), bench_run(skew=0.04)
    assert judge(late.jobs, late.views, late.bench, late.reported, feeding=False).problems == []
    problems = judge(skewed.jobs, skewed.views, skewed.bench, skewed.reported, feeding=False)
    assert [p[:15] for p in problems.problems] == ["(a) measurement"]


def test_a_slow_machine_is_not_the_supervisors_fault() -> None:
    """The daemon answers 80 ms late every time, and the first submissions take 120 ms to land:
    the realized rate is far below the model's, the stamps are off by up to 120 ms, yet the
    supervisor reported what happened and fed the pipeline at once after each answer."""
    run = bench_run(answer_late_s=0.08, fill_land_s=0.12, react_s=0.01)
    verdict = judge(run.jobs, run.views, run.bench, run.reported)
    model = steady_rate_per_s(simulate_closed_loop(12, 2, 2, 4))
    assert model is not None
    assert verdict.delivered < 0.95 * model * 3600  # the machine really delivered less
    assert abs(verdict.error) > 0.02  # and the client could not stamp it exactly
    assert verdict.problems == []
