"""Fleet manners, the pure decisions (docs/architecture.md, rule 7, issue 22): the shared backoff
and the
``Retry-After`` it honours, jittered timers, the drain's pace, and what counts as evidence of a
kill in a ``GET /status`` answer."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.backoff import (
    RETRY_AFTER_SPREAD,
    SharedBackoff,
    full_jitter_s,
    parse_retry_after,
)
from cuzk_supervisor.core.jitter import JitteredSchedule, first_delay, next_delay
from cuzk_supervisor.core.pace import Pace
from cuzk_supervisor.core.reconcile import find_record, gone_reason, listing_problem

NOW = datetime(2026, 12, 3, 8, 0, 0, tzinfo=UTC).timestamp()
units = st.floats(min_value=0, max_value=1, exclude_max=True)

# --- Retry-After ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 30.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
        # The three HTTP-date forms of RFC 9110, 90 s after NOW.
        ("Thu, 03 Dec 2026 08:01:30 GMT", 90.0),
        ("Thursday, 03-Dec-26 08:01:30 GMT", 90.0),
        ("Thu Dec  3 08:01:30 2026", 90.0),
        # A date in the past: go now.
        ("Thu, 03 Dec 2026 07:00:00 GMT", 0.0),
        # Unreadable or absent: no floor.
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("Thu, 32 Dec 2026 08:01:30 GMT", None),
        ("Thu, 03 Foo 2026 08:01:30 GMT", None),
        ("inf", None),
    ],
)
def test_retry_after_in_seconds_and_as_an_http_date(value, seconds):
    assert parse_retry_after(value, NOW) == seconds


# --- the shared backoff --------------------------------------------------------------------------


@given(failures=st.integers(min_value=1, max_value=200), u=units)
def test_full_jitter_stays_under_the_exponential_cap(failures, u):
    pause = full_jitter_s(failures, 0.5, 15.0, u)
    assert 0 <= pause <= min(15.0, 0.5 * 2 ** (failures - 1))


def test_one_backoff_grows_across_calls_and_an_answer_resets_it():
    backoff = SharedBackoff(base_s=1.0, max_s=60.0)
    # u = 1: the cap itself. Each failure, whichever call it was, doubles the next pause.
    assert [backoff.failed(0.0, 1.0) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.failing
    assert backoff.wait_s(0.0) == 60.0
    backoff.answered()
    assert not backoff.failing
    assert backoff.failed(100.0, 1.0) == 1.0  # a new outage starts small again


@given(after=st.floats(min_value=0, max_value=600), u=units, failures=st.integers(0, 10))
def test_no_request_before_a_retry_after(after, u, failures):
    backoff = SharedBackoff(base_s=0.5, max_s=15.0, failures=failures)
    pause = backoff.failed(10.0, u, retry_after_s=after)
    assert after <= pause <= max(after * (1 + RETRY_AFTER_SPREAD), 15.0)
    assert backoff.wait_s(10.0) == pytest.approx(pause)
    assert backoff.wait_s(10.0 + after - 0.001) > 0 or after < 0.001


def test_a_retry_after_holds_after_an_answer_and_a_huge_one_is_cut():
    backoff = SharedBackoff(base_s=0.5, max_s=15.0, max_after_s=600.0)
    backoff.failed(0.0, 0.0, retry_after_s=30.0)
    backoff.answered()  # another call got through meanwhile: the floor still holds
    assert backoff.wait_s(10.0) == 20.0
    backoff.failed(0.0, 0.0, retry_after_s=86_400.0)
    assert backoff.wait_s(0.0) == 600.0


def test_a_fleet_told_the_same_retry_after_comes_back_spread():
    rng = random.Random(7)
    pauses = [SharedBackoff(0.5, 15.0).failed(0.0, rng.random(), 30.0) for _ in range(2000)]
    assert min(pauses) >= 30.0
    assert max(pauses) <= 36.0
    per_second = [sum(1 for p in pauses if s <= p < s + 1) for s in range(30, 36)]
    assert max(per_second) < 3 * 2000 / 6  # no second holds 3x its share


def test_backoff_values_are_checked():
    with pytest.raises(ValueError, match="SharedBackoff"):
        SharedBackoff(base_s=2.0, max_s=1.0)


# --- jitter --------------------------------------------------------------------------------------


@given(interval=st.floats(min_value=0.1, max_value=3600), spread=st.floats(0, 0.5), u=units)
def test_jitter_bounds(interval, spread, u):
    assert 0 <= first_delay(interval, u) < interval or interval * u == interval
    later = next_delay(interval, spread, u)
    assert interval * (1 - spread) - 1e-9 <= later <= interval * (1 + spread) + 1e-9


def test_a_schedule_starts_anywhere_in_its_interval_then_varies_each_interval():
    draws = iter([0.25, 0.0, 1.0, 0.5])
    schedule = JitteredSchedule(60.0, 0.2, lambda: next(draws))
    assert [schedule.delay() for _ in range(4)] == pytest.approx([15.0, 48.0, 72.0, 60.0])


def test_a_fleet_started_in_the_same_second_does_not_tick_in_step():
    """2,000 timers of 60 s, started together: after a few ticks no second of the minute holds
    more than 3x the average (issue 22's lock-step criterion)."""
    rng = random.Random(22)
    ticks: list[float] = []
    for _ in range(2000):
        schedule = JitteredSchedule(60.0, 0.2, rng.random)
        at = 0.0
        while at < 600:
            at += schedule.delay()
            if 300 <= at < 600:
                ticks.append(at)
    per_second = [0] * 300
    for at in ticks:
        per_second[int(at - 300)] += 1
    average = len(ticks) / 300
    assert max(per_second) <= 3 * average


def test_a_new_interval_starts_anywhere_in_it_the_same_one_changes_nothing():
    draws = iter([0.5, 0.5, 0.25, 0.5])
    schedule = JitteredSchedule(2.0, 0.2, lambda: next(draws))
    assert [schedule.delay(), schedule.delay()] == pytest.approx([1.0, 2.0])
    schedule.set_interval(2.0)
    schedule.set_interval(120.0)
    assert [schedule.delay(), schedule.delay()] == pytest.approx([30.0, 120.0])


def test_a_fleet_that_changes_interval_together_does_not_tick_in_step():
    """2,000 flush timers at 2 s switch to 120 s within the same few seconds (the run phase
    reached together): from the switch on, no second holds more than 3x the average (without
    a fresh start at the new interval, every first tick falls within 96..144 s of the switch)."""
    rng = random.Random(22)
    ticks: list[float] = []
    for _ in range(2000):
        schedule = JitteredSchedule(2.0, 0.2, rng.random)
        at, switch = 0.0, 100.0 + 5.0 * rng.random()
        while at < 700:
            if at >= switch:
                schedule.set_interval(120.0)
            at += schedule.delay()
            if 200 <= at < 700:
                ticks.append(at)
    per_second = [0] * 500
    for at in ticks:
        per_second[int(at - 200)] += 1
    average = len(ticks) / 500
    assert max(per_second) <= 3 * average


# --- the drain's pace ----------------------------------------------------------------------------


def test_the_pace_allows_a_burst_then_its_rate():
    pace = Pace(rate_per_s=20.0, burst=500)
    assert pace.available(0.0) == 500
    pace.spend(0.0, 500)
    assert pace.wait_s(0.0, 500) == 25.0  # the next full body in 25 s
    assert pace.available(10.0) == 200
    assert pace.wait_s(10.0, 100) == 0.0
    assert pace.available(1000.0) == 500  # never more than one burst held


@given(backlog=st.integers(1, 10_000), rate=st.floats(1, 1000))
def test_a_backlog_drains_at_the_pace(backlog, rate):
    """Sent in full bodies whenever the pace allows: the time taken is what the rate says."""
    pace = Pace(rate_per_s=rate, burst=500)
    now, left, bodies = 0.0, backlog, 0
    while left:
        want = min(left, 500)
        now += pace.wait_s(now, want)
        pace.spend(now, want)
        left -= want
        bodies += 1
    assert bodies == -(-backlog // 500)
    assert now == pytest.approx(max(0.0, (backlog - 500) / rate), abs=1e-6)


# --- evidence of a kill --------------------------------------------------------------------------


def test_only_a_killed_record_is_evidence_of_a_kill():
    assert gone_reason({"uuid": "u", "state": "killed", "kill_reason": "manual"}) == (
        "killed by the manager: manual"
    )
    assert gone_reason({"uuid": "u", "state": "params_done"}) is None
    # Not listed in one answer: a proxy, a cache, a manager on an empty database say that too.
    assert gone_reason(None) is None


@pytest.mark.parametrize(
    ("listing", "problem"),
    [
        ([], "an empty list"),
        ({"error": "x"}, "not a list"),
        ("<html>", "not a list"),
        ([{"uuid": "other", "state": "running"}], None),  # a list without us: no evidence
    ],
)
def test_an_answer_that_cannot_be_the_managers_is_a_bad_answer(listing, problem):
    found = listing_problem(listing)
    if problem is None:
        assert found is None
        assert find_record(listing, "u-1") is None
    else:
        assert found is not None
        assert problem in found
