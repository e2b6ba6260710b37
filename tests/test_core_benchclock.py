"""The manager's benchmark clock (cuzk_supervisor.core.benchclock): the deadline on our monotonic
clock and whether one more measurement fits what is left of the budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.bench import BenchPolicy, Stretch, measurement_fits
from cuzk_supervisor.core.benchclock import (
    MIN_INTERVAL_S,
    bench_deadline,
    next_interval_s,
    prompt_ack,
    room_to_measure,
)

POLICY = BenchPolicy(max_proofs=12, concurrency=2, safety=1.25, min_proofs=3)


def test_before_the_manager_acknowledged_the_whole_budget_is_ahead():
    deadline = bench_deadline(now_monotonic=100.0, now_wall=1e9, clock_start=None, budget_s=2700)
    assert deadline == 2800.0


def test_the_managers_clock_counts_from_its_start_in_wall_time():
    # Started 600 s ago by the wall clock: 2100 s of the 2700 are left.
    deadline = bench_deadline(
        now_monotonic=50.0, now_wall=1_000_600.0, clock_start=1_000_000.0, budget_s=2700
    )
    assert deadline == pytest.approx(50.0 + 2100.0)


def test_a_budget_spent_long_ago_is_a_deadline_in_the_past():
    deadline = bench_deadline(now_monotonic=10.0, now_wall=10_000.0, clock_start=0.0, budget_s=60)
    assert deadline < 10.0


@given(
    mono=st.floats(0, 1e6),
    wall=st.floats(1e6, 2e9),
    ago=st.floats(0, 1e5),
    budget=st.floats(1, 1e5),
)
def test_time_left_is_the_budget_less_the_time_since_the_clock_started(mono, wall, ago, budget):
    deadline = bench_deadline(
        now_monotonic=mono, now_wall=wall, clock_start=wall - ago, budget_s=budget
    )
    assert deadline - mono == pytest.approx(budget - ago, abs=1e-3)


def _stretch(*completions: float, started_at: float = 0.0, interrupted: str = "") -> Stretch:
    return Stretch(
        workers=4,
        concurrency=2,
        started_at=started_at,
        completions=completions,
        submitted=len(completions),
        interrupted=interrupted,
    )


def test_the_interval_comes_from_the_latest_stretch_that_measured_one():
    older = _stretch(10.0, 20.0, 30.0)  # 10 s apart
    newer = _stretch(5.0, 7.0, 9.0)  # 2 s apart
    assert next_interval_s([older, newer], settle_s=50) == pytest.approx(2.0)
    # A latest stretch that measured nothing leaves the one before it to speak.
    assert next_interval_s([older, _stretch()], settle_s=50) == pytest.approx(10.0)


def test_with_nothing_measured_the_next_proof_is_as_slow_as_the_settle():
    assert next_interval_s([], settle_s=42.0) == 42.0
    assert next_interval_s([_stretch(interrupted="crash")], settle_s=42.0) == 42.0
    assert next_interval_s([], settle_s=0.0) == MIN_INTERVAL_S


def test_room_to_measure_is_the_bench_policys_fit_with_that_interval():
    stretches = [_stretch(10.0, 20.0, 30.0, interrupted="step-down")]
    # settle 10 s + (2 held + 2 queued ahead + 3 - 1) x 10 s = 70 s, x 1.25 = 87.5 s.
    assert room_to_measure(stretches, 10.0, 87.5, POLICY)
    assert not room_to_measure(stretches, 10.0, 87.4, POLICY)


@given(
    settle=st.floats(0, 1000),
    remaining=st.floats(-100, 10_000),
    gaps=st.lists(st.floats(0.1, 100), max_size=5),
)
def test_room_to_measure_agrees_with_measurement_fits(settle, remaining, gaps):
    times, t = [], 0.0
    for gap in gaps:
        t += gap
        times.append(t)
    stretches = [_stretch(*times, interrupted="restart")]
    interval = next_interval_s(stretches, settle)
    assert room_to_measure(stretches, settle, remaining, POLICY) == measurement_fits(
        remaining, settle, interval, POLICY
    )


def test_a_prompt_ack_is_one_within_one_request_of_its_queueing():
    assert prompt_ack(100.0, 100.0, 13.0)
    assert prompt_ack(100.0, 113.0, 13.0)
    assert not prompt_ack(100.0, 113.5, 13.0)  # retried, or the manager slow: read the stamp
    assert not prompt_ack(100.0, 99.0, 13.0)  # acknowledged before it was queued: clocks off
    assert not prompt_ack(None, 100.0, 13.0)  # not known
