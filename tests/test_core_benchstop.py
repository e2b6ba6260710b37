"""The adaptive stop (cuzk_supervisor.core.benchstop; issue 25 item 5, issue 32): pure, no process.

The rule ends a stretch early only on a rate known within the precision, past its floor and its
soak, on a machine that holds still, with its verdict certain; it goes on past the batch while
the rate it would report is not known; a drift is reported as the rate held at the end; and
stopping must not bend the rate. bench/stop_stats.py measures the same claims over many seeded
runs of a noisier model; these are their unit-sized cases.
"""

from __future__ import annotations

import random
import re
import statistics

import pytest

from cuzk_supervisor.core.bench import (
    BenchPolicy,
    Stretch,
    next_submission,
    planned_proofs,
    steady_rate_per_s,
)
from cuzk_supervisor.core.benchreport import choose_measurement
from cuzk_supervisor.core.benchstop import StopCall, StopRule, knowledge, stop_call
from cuzk_supervisor.sim.daemon.pipeline import JobProved, Pipeline, simulate_closed_loop

INTERVAL = 100.0  # seconds between completions: 36 proofs/hour
RATE = 1 / INTERVAL


def rule(**changes: object) -> StopRule:
    values: dict[str, object] = {"precision": 0.01, "floor": 3, "batch": 12, "most": 36}
    values.update(changes)
    return StopRule(**values)  # type: ignore[arg-type]


def times(intervals: list[float], start: float = 500.0) -> list[float]:
    done, t = [start], start
    for gap in intervals:
        t += gap
        done.append(t)
    return done


def noisy(n: int, cv: float, rng: random.Random, interval: float = INTERVAL) -> list[float]:
    """``n`` completions of a renewal process: intervals with coefficient of variation ``cv``."""
    return times([max(1e-3, rng.gauss(interval, cv * interval)) for _ in range(n - 1)])


def call(done: list[float], r: StopRule, elapsed_s: float = 1e9) -> StopCall:
    return stop_call(done, r, elapsed_s=elapsed_s)


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("min_rate", [0.0, RATE / 10])
def test_never_stops_below_the_floor(min_rate):
    r = rule(floor=7, min_rate_per_s=min_rate)
    for n in range(1, 7):
        assert not call(times([INTERVAL] * (n - 1)), r).stop, n
    assert call(times([INTERVAL] * 6), r).stop


def test_a_steady_rate_stops_for_precision_at_the_floor_of_four_intervals():
    assert not call(times([INTERVAL] * 3), rule()).stop
    c = call(times([INTERVAL] * 4), rule())
    assert (c.stop, c.kind) == (True, "precision")


def test_no_early_stop_before_the_soak_however_precise():
    done = times([INTERVAL] * 8)
    r = rule(soak_s=1200.0)
    c = call(done, r, elapsed_s=1100.0)
    assert not c.stop
    assert c.limit == 12  # it is known: the batch, not more
    assert "soaking" in c.reason
    assert call(done, r, elapsed_s=1200.0).stop


def test_off_it_runs_the_batch():
    c = call(times([INTERVAL] * 11), rule(precision=0.0))
    assert (c.stop, c.limit) == (False, 12)


def test_near_the_minimum_it_goes_on_past_the_batch_even_when_precise():
    done = noisy(36, 0.003, random.Random(1))  # the rate is the minimum, 0.3 % noise a proof
    for n in range(5, 37):
        c = call(done[:n], rule(min_rate_per_s=RATE))
        assert not c.stop, (n, c.reason)
        assert c.limit == 36
        assert "too close" in c.reason


def test_clear_of_the_minimum_a_precise_rate_stops_as_precision():
    c = call(times([INTERVAL] * 4), rule(min_rate_per_s=RATE / 2))
    assert (c.stop, c.kind) == (True, "precision")
    assert "above the minimum" in c.reason


def test_a_certain_verdict_alone_does_not_cut_the_batch_short():
    """8 % noise at twice the minimum: the verdict is certain early, the rate is not; ending
    there would report it with its error, so it runs its batch (and on, while imprecise)."""
    rng = random.Random(3)
    for _ in range(50):
        done = noisy(12, 0.08, rng)
        for n in range(3, 13):
            c = call(done[:n], rule(min_rate_per_s=RATE / 2))
            assert not c.stop, (n, c.reason)


@pytest.mark.parametrize("seed", range(20))
def test_a_noisy_rate_does_not_stop_early_and_goes_on_past_the_batch(seed):
    """5 % noise on each interval: ±1 % needs far more proofs than the batch."""
    done = noisy(12, 0.05, random.Random(seed))
    for n in range(3, 13):
        c = call(done[:n], rule())
        assert not c.stop, n
        assert c.limit == 36, n


def test_a_drifting_rate_is_not_caught_on_its_fast_stretch():
    """Intervals lengthening 1 % a proof (a GPU warming into its throttle) are smooth enough to
    look precise, but the halves disagree: no early stop, whatever the precision says."""
    done = times([INTERVAL * 1.01**k for k in range(11)])
    for n in range(3, 13):
        c = call(done[:n], rule())
        assert not c.stop, (n, c.reason)
    known = knowledge(done, (), rule())
    assert known.drifting
    # The rate reported is the latest part's, and its stated error reaches the rate at the end.
    assert known.start > 0
    assert known.rate_per_s is not None
    assert known.half_width is not None
    at_end = RATE / 1.01**10
    assert abs(known.rate_per_s / at_end - 1) <= known.half_width


def test_a_step_is_reported_as_the_rate_held_at_the_end():
    """10 % slower from the 7th proof on: the whole batch would say +5 %; the part after the
    change is what the machine holds, and the record says it drifted."""
    done = times([INTERVAL] * 6 + [INTERVAL * 1.1] * 14)
    known = knowledge(done, (), rule())
    assert known.drifting
    assert known.settled
    assert known.start == 6
    assert known.rate_per_s == pytest.approx(RATE / 1.1)
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01, most_proofs=36)
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0, completions=tuple(done),
                      submitted=21, stop="known")  # fmt: skip
    m = choose_measurement([stretch], policy)
    assert m.drifted
    assert m.rate_per_hour == pytest.approx(36 / 1.1)
    assert (m.proofs, m.stretch_proofs) == (15, 21)
    assert "drifted" in m.reason


def test_no_early_stop_while_the_halves_disagree_even_past_the_floor_and_soak():
    done = times([INTERVAL] * 5 + [INTERVAL * 1.1] * 4)
    c = call(done, rule())
    assert not c.stop
    assert "moving" in c.reason or "not yet" in c.reason


@pytest.mark.parametrize("cv", [0.003, 0.01])
def test_stopping_on_its_own_spread_does_not_bias_the_rate(cv):
    """Many runs of a noisy pipeline: the rate where the adaptive stop ended each run (its
    in-flight proof counted, as the lifecycle counts it) averages to the same as the fixed
    batch's, and both to the truth."""
    rng = random.Random(11)
    adaptive, fixed, used = [], [], []
    r = rule()
    for _ in range(800):
        done = noisy(13, cv, rng)
        n = next((n for n in range(5, 13) if call(done[:n], r).stop), 12)
        kept = done[: n + 1]  # the proof in flight at the stop finishes and counts
        adaptive.append(steady_rate_per_s(kept) / RATE - 1)  # type: ignore[operator]
        fixed.append(steady_rate_per_s(done[:12]) / RATE - 1)  # type: ignore[operator]
        used.append(len(kept))
    assert abs(statistics.mean(adaptive)) < 0.001
    assert abs(statistics.mean(adaptive) - statistics.mean(fixed)) < 0.0005
    if cv < 0.005:
        assert statistics.mean(used) < 9  # it did stop early, mostly


def test_a_wrong_verdict_is_rare_near_the_minimum():
    """3 % above the minimum with 3 % noise a proof: where the stretch would end (early, the
    batch once known and certain, or 36 proofs), the rate is rarely below it."""
    rng = random.Random(5)
    wrong = 0
    r = rule(min_rate_per_s=RATE / 1.03)
    for _ in range(300):
        done = noisy(37, 0.03, rng)
        n = next((n for n in range(5, 37) if (c := call(done[:n], r)).stop or n >= c.limit), 36)
        wrong += steady_rate_per_s(done[:n]) < RATE / 1.03  # type: ignore[operator]
    assert wrong <= 3  # 1 %


# --- in the batch (core.bench) ----------------------------------------------------------------


def run_model(workers: int, policy: BenchPolicy, budget_s: float = 1e9) -> Stretch:
    """The lifecycle's loop against the simulator's pipeline model (2 GPU workers)."""
    pipe = Pipeline(workers, 2)
    stretch = Stretch(workers=workers, concurrency=policy.concurrency, started_at=0.0)
    now = 0.0

    def fill(stretch: Stretch) -> Stretch:
        while (decision := next_submission(stretch, now, budget_s, policy)).submit:
            pipe.submit(stretch.submitted, now)
            stretch = stretch.submitted_one()
        return stretch.close(decision.reason, decision.stop) if decision.closes else stretch

    stretch = fill(stretch)
    while stretch.in_flight:
        now = pipe.next_deadline()  # type: ignore[assignment]
        for event in pipe.advance(now):
            if isinstance(event, JobProved):
                stretch = stretch.completed(event.at)
        stretch = fill(stretch)
    return stretch


def model_rate_per_hour(workers: int, concurrency: int) -> float:
    done = simulate_closed_loop(workers, 2, concurrency, 500)
    return (len(done) - 100) / (done[-1] - done[99]) * 3600


@pytest.mark.parametrize(("workers", "concurrency"), [(2, 2), (5, 2), (10, 2), (2, 3)])
def test_on_a_quiet_machine_the_batch_stops_early_with_the_rate_within_1_percent(
    workers, concurrency
):
    policy = BenchPolicy(max_proofs=12, concurrency=concurrency, precision=0.01)
    stretch = run_model(workers, policy)
    assert stretch.stop == "precision"
    assert stretch.submitted < 12
    m = choose_measurement([stretch], policy)
    assert m.stopped == "precision"
    assert m.precise
    assert m.uncertainty is not None
    assert m.uncertainty <= 0.01
    truth = model_rate_per_hour(workers, concurrency)
    assert abs(m.rate_per_hour / truth - 1) <= 0.01


def test_the_soak_holds_a_quiet_machine_to_its_time():
    # Room for the soak's ~10 completions and the proofs held beyond them (concurrency 2 +
    # queue_ahead 2): a batch that ran out of proofs would say so instead.
    policy = BenchPolicy(max_proofs=16, concurrency=2, precision=0.01, min_soak_s=1400.0)
    stretch = run_model(2, policy)  # 152 s a proof
    assert stretch.stop == "precision"
    # The stop came at the first completion past the soak, not before it.
    counted = int(re.search(r"over (\d+) completions", stretch.closed)[1])  # type: ignore[index]
    assert stretch.completions[counted - 1] >= 1400.0 > stretch.completions[counted - 2]
    # Without the soak the same machine is known far earlier.
    unsoaked = run_model(2, BenchPolicy(max_proofs=16, concurrency=2, precision=0.01))
    assert len(unsoaked.completions) < len(stretch.completions)


def test_near_the_minimum_the_batch_goes_on_to_its_most_then_says_so():
    truth = model_rate_per_hour(2, 2)
    policy = BenchPolicy(max_proofs=6, concurrency=2, precision=0.01, most_proofs=10,
                         min_rate=truth * 1.0005)  # fmt: skip
    stretch = run_model(2, policy)
    assert (stretch.submitted, stretch.stop) == (10, "max-proofs")
    assert choose_measurement([stretch], policy).stopped == "max-proofs"


def test_fixed_and_budget_stops_are_named():
    fixed = run_model(2, BenchPolicy(max_proofs=5, concurrency=2))
    assert (fixed.submitted, fixed.stop) == (5, "batch-complete")
    short = run_model(2, BenchPolicy(max_proofs=12, concurrency=2), budget_s=800)
    assert short.stop == "budget"
    assert short.submitted < 12
    assert choose_measurement([short], BenchPolicy()).stopped == "budget"


def test_a_budget_too_short_for_the_precision_says_so_and_what_it_would_take():
    """5 % noise a proof, a budget for 8: the rate is reported with its honest interval and
    flagged, never as a confident small-sample number."""
    done = noisy(8, 0.05, random.Random(4))
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01)
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0, completions=tuple(done),
                      submitted=8, stop="budget")  # fmt: skip
    m = choose_measurement([stretch], policy)
    assert m.precise is False
    assert m.uncertainty is not None
    assert m.uncertainty > 0.01
    assert m.needed > 8
    assert "imprecise" in m.reason
    assert f"about {m.needed} proofs" in m.reason


def test_a_lumpy_pipeline_goes_on_until_its_cycles_are_measured():
    """7 workers: the intervals repeat a cycle of 7 with the partition rounds; the batch
    means over whole cycles know the rate once a few cycles are in."""
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01, most_proofs=40)
    stretch = run_model(7, policy)
    assert 12 < stretch.submitted <= 40
    assert stretch.stop == "known"
    m = choose_measurement([stretch], policy)
    assert m.precise
    assert abs(m.rate_per_hour / model_rate_per_hour(7, 2) - 1) <= 0.01


def test_past_the_batch_it_ends_as_soon_as_what_it_reports_is_known():
    """It went on past its 12 while too close to tell; 3 % noise, 20 % above the minimum."""
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.05, most_proofs=36,
                         min_rate=RATE * 3600 / 1.2)  # fmt: skip
    done = noisy(20, 0.03, random.Random(2))
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0, submitted=21)
    for t in done:
        stretch = stretch.completed(t)
    decision = next_submission(stretch, done[-1], 1e9, policy)
    assert (decision.submit, decision.closes, decision.stop) == (False, True, "known")


def test_a_starved_supervisor_submitting_late_keeps_the_rate_where_the_pipeline_has_slack():
    """Every proof submitted half an interval late (a supervisor starved of CPU): at 2 workers
    the proof still in flight keeps the partitions busy, nothing idles, and the rate holds."""
    truth = model_rate_per_hour(2, 2)
    pipe = Pipeline(2, 2)
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0)
    for seq in range(2):
        pipe.submit(seq, 0.0)
        stretch = stretch.submitted_one(0.0)
    waiting: list[float] = []
    while len(stretch.completions) < 16:
        due = pipe.next_deadline()
        if waiting and (due is None or waiting[0] <= due):
            at = waiting.pop(0)
            pipe.submit(stretch.submitted, at)
            stretch = stretch.submitted_one(at)
            continue
        assert due is not None
        for event in pipe.advance(due):
            if isinstance(event, JobProved):
                stretch = stretch.completed(event.at)
                waiting.append(event.at + 76.0)  # half of 152 s
    m = choose_measurement([stretch], BenchPolicy(max_proofs=16, precision=0.01))
    assert m.late >= 10
    assert abs(m.rate_per_hour / truth - 1) <= 0.01
    assert m.proofs == 16  # nothing thrown away: no piece smaller than the stretch


def test_progress_counts_the_batch_or_what_went_past_it():
    policy = BenchPolicy(max_proofs=12, concurrency=2)
    assert planned_proofs(Stretch(2, 2, 0.0, submitted=5), policy) == 12
    assert planned_proofs(Stretch(2, 2, 0.0, submitted=20), policy) == 20
