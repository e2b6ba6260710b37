"""A stretch's rate and its uncertainty (cuzk_supervisor.core.benchrate, issue 32): properties
that hold for any completions, and the cases each piece of the arithmetic is for."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_supervisor.core.benchrate import (
    BATCHES,
    change_point,
    cycle,
    kept_intervals,
    pieces,
    rate_spread,
    seconds_per_proof,
    settled_start,
    steady_rate_per_s,
    t_quantile,
)

gaps_st = st.lists(st.floats(1.0, 1000.0), min_size=4, max_size=40)


def times(gaps: list[float], start: float = 100.0) -> list[float]:
    return [start, *(start + sum(gaps[: i + 1]) for i in range(len(gaps)))]


# --- the rate ---------------------------------------------------------------------------------


def test_t_quantiles_are_students_and_fall_back_to_the_normal():
    assert t_quantile(1, 0.95) == pytest.approx(12.706)
    assert t_quantile(11, 0.95) == t_quantile(10, 0.95)  # between keys: the larger value
    assert t_quantile(500, 0.99) == pytest.approx(2.576)
    with pytest.raises(ValueError, match="df"):
        t_quantile(0, 0.95)


def test_slope_of_evenly_spaced_completions_is_their_rate():
    assert steady_rate_per_s([10.0, 20.0, 30.0, 40.0]) == pytest.approx(0.1)
    assert steady_rate_per_s([5.0]) is None
    assert steady_rate_per_s([5.0, 5.0]) is None


@settings(max_examples=200, deadline=None)
@given(
    interval=st.floats(1.0, 500.0),
    offsets=st.lists(st.floats(0.0, 5000.0), min_size=1, max_size=4),
    sizes=st.lists(st.integers(2, 8), min_size=4, max_size=4),
)
def test_a_wait_between_pieces_never_bends_the_pooled_rate(interval, offsets, sizes):
    """However long the pipeline waited at each break (a late resubmission), the rate of the
    pieces is the one they share."""
    done: list[float] = []
    breaks: set[int] = set()
    t = 0.0
    for offset, size in zip(offsets, sizes, strict=False):
        if done:
            breaks.add(len(done))
            t += offset
        for _ in range(size):
            done.append(t)
            t += interval
    assert steady_rate_per_s(done, breaks) == pytest.approx(1 / interval, rel=1e-9)


@given(gaps=gaps_st, cut=st.integers(1, 39))
def test_a_break_leaves_out_exactly_its_interval(gaps, cut):
    done = times(gaps)
    cut = min(cut, len(done) - 1)
    kept = kept_intervals(done, {cut})
    assert kept == pytest.approx([g for i, g in enumerate(gaps, start=1) if i != cut])
    assert sum(len(p) for p in pieces(done, {cut})) == len(done)


# --- the spread -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(gaps=gaps_st, scale=st.floats(0.01, 100.0), shift=st.floats(-1e6, 1e6))
def test_the_spread_does_not_depend_on_the_clock_s_unit_or_origin(gaps, scale, shift):
    one = rate_spread(times(gaps))
    other = rate_spread([shift + scale * t for t in times(gaps)])
    assert one is not None
    assert other is not None
    assert other.relative_se == pytest.approx(one.relative_se, rel=1e-6, abs=1e-9)
    assert other.drift == pytest.approx(one.drift, rel=1e-6, abs=1e-9)
    assert other.half_width(0.95) >= 0


def test_even_completions_have_no_spread_and_few_have_none_at_all():
    spread = rate_spread(times([100.0] * 6))
    assert spread is not None
    assert spread.half_width(0.95) == 0
    assert spread.drift == pytest.approx(0.0)
    assert rate_spread([1.0, 2.0, 3.0]) is None


def test_a_wider_confidence_is_a_wider_interval():
    spread = rate_spread(times([random.Random(1).gauss(100, 5) for _ in range(12)]))
    assert spread is not None
    assert spread.half_width(0.99) > spread.half_width(0.95) > 0
    assert spread.cautious_width(0.95) >= spread.half_width(0.95) or spread.intervals < 2 * BATCHES


def test_lumps_of_a_pipeline_are_a_cycle_not_noise():
    """Two short intervals then a long one, again and again (partition rounds): batches over
    whole cycles see no spread where the intervals, taken one by one, look very noisy."""
    gaps = [40.0, 40.0, 90.0] * 8
    assert cycle(gaps) == 3
    spread = rate_spread(times(gaps))
    assert spread is not None
    assert spread.half_width(0.95) == pytest.approx(0.0, abs=1e-9)
    assert cycle([random.Random(2).gauss(100, 5) for _ in range(24)]) == 1


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_independent_intervals_are_batched_as_they_come(seed):
    rng = random.Random(seed)
    gaps = [rng.gauss(100, 3) for _ in range(20)]
    spread = rate_spread(times(gaps))
    assert spread is not None
    assert 2 <= spread.batches <= 2 * BATCHES


# --- drift ------------------------------------------------------------------------------------


def test_a_step_is_found_where_it_is():
    done = times([100.0] * 8 + [110.0] * 10)
    assert change_point(done, (), floor=5) == 8
    spread = rate_spread(done)
    assert spread is not None
    assert spread.drifting(0.005)
    assert settled_start(done, (), floor=5, tolerance=0.005) == 8


def test_a_machine_that_holds_still_settles_from_its_start():
    rng = random.Random(7)
    done = times([rng.gauss(100, 1) for _ in range(20)])
    assert settled_start(done, (), floor=5, tolerance=0.005) == 0


def test_a_drift_smaller_than_the_tolerance_is_not_a_moving_machine():
    done = times([100.0] * 10 + [100.2] * 10)  # 0.2 % slower: significant, but tiny
    spread = rate_spread(done)
    assert spread is not None
    assert spread.drifting(0.0)
    assert not spread.drifting(0.005)


@settings(max_examples=100, deadline=None)
@given(gaps=gaps_st, floor=st.integers(2, 8))
def test_the_settled_part_always_keeps_the_floor(gaps, floor):
    done = times(gaps)
    start = settled_start(done, (), floor=floor, tolerance=0.005)
    assert 0 <= start <= max(0, len(done) - floor)


def test_halves_are_compared_by_their_own_slopes():
    done = times([100.0] * 6 + [120.0] * 6)
    spread = rate_spread(done)
    assert spread is not None
    assert spread.drift == pytest.approx(100 / 120 - 1)
    assert all(b > a for a, b in itertools.pairwise(done))


def test_seconds_per_proof_needs_two_completions_in_a_piece():
    assert seconds_per_proof([1.0, 2.0, 3.0, 4.0, 5.0], {2}) == pytest.approx(1.0)
