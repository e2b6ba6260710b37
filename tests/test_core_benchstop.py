"""The adaptive stop (cuzk_supervisor.core.benchstop, issue 25 item 5): pure functions, no process.

The rule ends a stretch when its rate is known within the precision or its verdict against the
minimum is certain, never below the floor, goes on while the rate is too close to the minimum,
and must not bend the rate: a noisy rate does not stop early, a drifting one is not caught on
its fast stretch, and stopping on the data's own spread leaves the rate unbiased.
"""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from cuzk_supervisor.core.bench import (
    BenchPolicy,
    Stretch,
    choose_measurement,
    next_submission,
    planned_proofs,
    steady_rate_per_s,
)
from cuzk_supervisor.core.benchstop import (
    StopCall,
    StopRule,
    rate_spread,
    stop_call,
    t_quantile,
)
from cuzk_supervisor.sim.pipeline import JobProved, Pipeline, simulate_closed_loop

INTERVAL = 100.0  # seconds between completions: 36 proofs/hour
RATE = 1 / INTERVAL


def rule(**changes: object) -> StopRule:
    values: dict[str, object] = {"precision": 0.01, "floor": 3, "batch": 12, "most": 36}
    values.update(changes)
    return StopRule(**values)  # type: ignore[arg-type]


def times(intervals: list[float], start: float = 500.0) -> list[float]:
    done, t = [], start
    for gap in intervals:
        t += gap
        done.append(t)
    return [start, *done]


def noisy(n: int, cv: float, rng: random.Random, interval: float = INTERVAL) -> list[float]:
    """``n`` completions of a renewal process: intervals with coefficient of variation ``cv``."""
    return times([max(1e-3, rng.gauss(interval, cv * interval)) for _ in range(n - 1)])


def call(done: list[float], r: StopRule) -> StopCall:
    return stop_call(done, steady_rate_per_s(done), r)


# --- the uncertainty --------------------------------------------------------------------------


def test_t_quantiles_are_students_and_fall_back_to_the_normal():
    assert t_quantile(1, 0.95) == pytest.approx(12.706)
    assert t_quantile(11, 0.95) == t_quantile(10, 0.95)  # between keys: the larger value
    assert t_quantile(500, 0.99) == pytest.approx(2.576)


def test_even_completions_have_no_spread_and_few_have_none_at_all():
    spread = rate_spread(times([INTERVAL] * 5))
    assert spread is not None
    assert spread.half_width(0.95) == 0
    assert spread.drift == 0
    assert rate_spread([1.0, 2.0]) is None


def test_the_spread_is_of_the_intervals_not_of_the_residuals():
    """A random walk hugs its own least-squares line: its residuals would promise a precision
    the intervals do not have."""
    rng = random.Random(7)
    done = noisy(12, 0.05, rng)
    spread = rate_spread(done)
    assert spread is not None
    gaps = [b - a for a, b in itertools.pairwise(done)]
    cv = statistics.stdev(gaps) / statistics.mean(gaps)
    assert spread.relative_se == pytest.approx(1.1 * cv / (len(gaps) ** 0.5))


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("min_rate", [0.0, RATE / 10])
def test_never_stops_below_the_floor(min_rate):
    r = rule(floor=6, min_rate_per_s=min_rate)
    for n in range(6):
        assert not call(times([INTERVAL] * max(0, n - 1)), r).stop, n
    assert call(times([INTERVAL] * 5), r).stop


def test_a_steady_rate_stops_for_precision_at_the_floor_of_four_intervals():
    assert not call(times([INTERVAL] * 3), rule()).stop
    c = call(times([INTERVAL] * 4), rule())
    assert (c.stop, c.kind) == (True, "precision")


def test_off_it_runs_the_batch():
    c = call(times([INTERVAL] * 11), rule(precision=0.0))
    assert (c.stop, c.limit) == (False, 12)


def test_near_the_minimum_it_goes_on_past_the_batch_even_when_precise():
    done = noisy(36, 0.005, random.Random(1))  # the rate is the minimum, 0.5 % noise a proof
    precise = 0
    for n in range(5, 37):
        c = call(done[:n], rule(min_rate_per_s=RATE))
        assert not c.stop, (n, c.reason)
        assert c.limit == 36
        assert "too close" in c.reason
        spread = rate_spread(done[:n])
        precise += spread is not None and spread.half_width(0.95) <= 0.01
    assert precise > 20  # known within ±1 % for most of it, and still no verdict


def test_clear_of_the_minimum_a_precise_rate_stops_as_precision():
    c = call(times([INTERVAL] * 4), rule(min_rate_per_s=RATE / 2))
    assert (c.stop, c.kind) == (True, "precision")


def test_a_certain_verdict_alone_does_not_cut_the_batch_short():
    """8 % noise at twice the minimum: the verdict is certain early, the rate is not; ending
    there would report it with its error, so it runs its batch."""
    rng = random.Random(3)
    for _ in range(50):
        done = noisy(12, 0.08, rng)
        for n in range(3, 13):
            c = call(done[:n], rule(min_rate_per_s=RATE / 2))
            assert not c.stop, (n, c.reason)


def test_past_the_batch_it_ends_as_soon_as_the_verdict_is_certain():
    """It went on past its 12 while too close to tell; 3 % noise, 20 % above the minimum."""
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01, most_proofs=36,
                         min_rate=RATE * 3600 / 1.2)  # fmt: skip
    done = noisy(20, 0.03, random.Random(2))
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0, submitted=21)
    for t in done:
        stretch = stretch.completed(t)
    decision = next_submission(stretch, done[-1], 1e9, policy)
    assert (decision.submit, decision.closes, decision.stop) == (False, True, "verdict-certain")
    assert "above the minimum" in decision.reason
    # Precise by then too: still the verdict that ended it.
    steady = Stretch(workers=2, concurrency=2, started_at=0.0, submitted=21)
    for t in times([INTERVAL] * 19):
        steady = steady.completed(t)
    decision = next_submission(steady, steady.completions[-1], 1e9, policy)
    assert (decision.closes, decision.stop) == (True, "verdict-certain")


@pytest.mark.parametrize("seed", range(20))
def test_a_noisy_rate_does_not_stop_early(seed):
    """5 % noise on each interval: ±1 % needs far more proofs than the batch."""
    done = noisy(12, 0.05, random.Random(seed))
    for n in range(3, 13):
        assert not call(done[:n], rule()).stop, n


def test_a_drifting_rate_is_not_caught_on_its_fast_stretch():
    """Intervals lengthening 0.6 % a proof (a GPU warming into its throttle) are smooth enough
    to look precise, but the latest half is slower than the whole."""
    done = times([INTERVAL * 1.006**k for k in range(11)])
    for n in range(3, 13):
        c = call(done[:n], rule())
        assert not c.stop, (n, c.reason)
    spread = rate_spread(done)
    assert spread is not None
    assert spread.drift < -0.01


@pytest.mark.parametrize("cv", [0.003, 0.01])
def test_stopping_on_its_own_spread_does_not_bias_the_rate(cv):
    """Many runs of a noisy pipeline: the rate where the adaptive stop ended each run (its
    in-flight proof counted, as the lifecycle counts it) averages to the same as the fixed
    batch's, and both to the truth."""
    rng = random.Random(11)
    adaptive, fixed, used = [], [], []
    r = rule()
    for _ in range(1500):
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
    """2 % above the minimum with 3 % noise a proof: where the stretch would end (precision,
    the batch once the verdict is certain, or 36 proofs), the rate is rarely below it."""
    rng = random.Random(5)
    wrong = 0
    r = rule(min_rate_per_s=RATE / 1.02)
    for _ in range(400):
        done = noisy(37, 0.03, rng)
        n = next((n for n in range(5, 37) if (c := call(done[:n], r)).stop or n >= c.limit), 36)
        wrong += steady_rate_per_s(done[:n]) < RATE / 1.02  # type: ignore[operator]
    assert wrong <= 8


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
    assert m.uncertainty is not None
    assert m.uncertainty <= 0.01
    truth = model_rate_per_hour(workers, concurrency)
    assert abs(m.rate_per_hour / truth - 1) <= 0.01


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


def test_a_lumpy_pipeline_runs_its_batch():
    """7 workers: the intervals alternate with the partition rounds; that is spread, not a
    known rate, so the adaptive batch is the fixed one."""
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01)
    stretch = run_model(7, policy)
    assert (stretch.submitted, stretch.stop) == (12, "batch-complete")


def test_the_stop_looks_at_the_piece_after_the_last_stall():
    policy = BenchPolicy(max_proofs=12, concurrency=2, precision=0.01)
    stretch = Stretch(workers=2, concurrency=2, started_at=0.0, submitted=4)
    for t in (100.0, 200.0, 300.0):
        stretch = stretch.completed(t)
    stretch = stretch.completed(420.0, heard_late=True)
    assert stretch.measuring == ()
    decision = next_submission(stretch, 420.0, 1e9, policy)
    assert decision.submit
    assert not decision.closes


def test_a_stall_late_in_the_batch_gives_the_new_piece_a_batch_of_its_own():
    """CI's failure: a completion heard late at proof 12 of 16 left a piece of 4 proofs (±10 %)
    to report from; the piece after the stall is measured on a whole batch."""
    policy = BenchPolicy(max_proofs=16, concurrency=2)
    stretch = Stretch(workers=11, concurrency=2, started_at=0.0, submitted=13)
    for k in range(1, 13):
        stretch = stretch.completed(40.0 * k, heard_late=(k == 12))
    assert stretch.measuring_submitted == 1  # the one in flight at the stall
    decision = next_submission(stretch, 480.0, 1e9, policy)
    assert decision.submit
    assert planned_proofs(stretch, policy) == 12 + 16
    # Without a stall the same count ends the batch.
    plain = Stretch(workers=11, concurrency=2, started_at=0.0, submitted=16)
    for k in range(1, 16):
        plain = plain.completed(40.0 * k)
    assert next_submission(plain, 600.0, 1e9, policy).stop == "batch-complete"
    assert planned_proofs(plain, policy) == 16
