"""Benchmark sizing and rate: pure."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.bench import proofs_per_hour, size_bench


def test_whole_batch_when_it_fits():
    size = size_bench(12, 2, per_proof_s=100, remaining_s=2000)
    assert (size.count, size.concurrency) == (12, 2)


def test_cut_to_fit_the_remaining_budget():
    size = size_bench(12, 2, per_proof_s=100, remaining_s=700, safety=1.25)
    assert size.count == 5
    assert "cut from 12 to 5" in size.reason


def test_one_proof_even_when_none_fits_and_concurrency_follows():
    size = size_bench(12, 4, per_proof_s=100, remaining_s=10)
    assert (size.count, size.concurrency) == (1, 1)
    assert "not even one" in size.reason


@given(
    requested=st.integers(1, 50),
    concurrency=st.integers(1, 8),
    per_proof=st.floats(0.01, 1e4),
    remaining=st.floats(-100, 1e6),
)
def test_estimate_fits_whenever_more_than_one_proof_runs(
    requested, concurrency, per_proof, remaining
):
    size = size_bench(requested, concurrency, per_proof, remaining)
    assert 1 <= size.count <= requested
    assert size.concurrency <= size.count
    if size.count > 1:
        assert size.estimated_s <= remaining + 1e-6


def test_rate_from_wall_clock():
    assert proofs_per_hour(6, 900.0) == pytest.approx(24.0)
    assert proofs_per_hour(0, 10.0) == 0.0
    assert proofs_per_hour(3, 0.0) == 0.0
