"""The pure timing model: the cuzk.md §3 table, the long-run rate, the first-proof figures."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim import model
from cuzk_supervisor.sim.model import GIB
from cuzk_supervisor.sim.pipeline import batch_proofs_per_hour, simulate_closed_loop

# cuzk.md §3: partition_workers -> steady-state seconds per proof.
TABLE = {1: 290.0, 2: 152.0, 5: 68.4, 7: 53.3, 10: 42.5, 12: 42.5}


@pytest.mark.parametrize(("workers", "seconds"), sorted(TABLE.items()))
def test_steady_state_reproduces_the_table(workers: int, seconds: float) -> None:
    assert model.steady_state_seconds_per_proof(workers) == pytest.approx(seconds, abs=0.05)


def test_partition_time_interpolates_and_extrapolates() -> None:
    assert model.partition_seconds(1) == 29.0
    assert model.partition_seconds(3) == pytest.approx(30.4 + (34.2 - 30.4) / 3)
    assert model.partition_seconds(11) == pytest.approx((42.5 + 51.0) / 2)
    assert model.partition_seconds(14) == pytest.approx(51.0 + 2 * (51.0 - 42.5) / 2)
    assert model.partition_seconds(0) == 29.0  # never below one active


def test_rate_formula_uses_active_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 workers: 2 partitions at once whatever the concurrency.
    assert model.steady_state_proofs_per_hour(2, 2, 2) == pytest.approx(3600 / 152)
    # 5 workers at concurrency 1 vs 2: a lone proof still keeps 5 partitions busy.
    assert model.steady_state_proofs_per_hour(5, 1, 2) == pytest.approx(3600 / 68.4)
    # 20 workers at concurrency 1: only the proof's own 10 partitions can be active.
    assert model.steady_state_proofs_per_hour(20, 1, 2) == pytest.approx(3600 / 42.5)
    assert model.steady_state_proofs_per_hour(0, 2, 2) == 0.0


def test_rate_formula_caps_at_gpu_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # With 3 s per partition the GPU never binds (synthesis tops out at 84.7/h), so make
    # the GPU slow: 1 worker at 30 s per partition = 12 proofs/hour.
    monkeypatch.setattr(model, "GPU_SECONDS_PER_PARTITION", 30.0)
    assert model.steady_state_proofs_per_hour(10, 2, 1) == pytest.approx(12.0)
    assert model.steady_state_proofs_per_hour(10, 2, 2) == pytest.approx(24.0)


@pytest.mark.parametrize(("workers", "concurrency"), [(2, 2), (1, 2), (5, 2), (10, 2), (12, 3)])
def test_discrete_run_converges_to_the_steady_state(workers: int, concurrency: int) -> None:
    done = simulate_closed_loop(workers, 2, concurrency, 400)
    measured = 200 / (done[399] - done[199]) * 3600
    expected = model.steady_state_proofs_per_hour(workers, concurrency, 2)
    assert measured == pytest.approx(expected, rel=1e-3)


def test_a_six_proof_batch_at_two_workers_is_within_two_percent() -> None:
    # The acceptance figure: 6 proofs at concurrency 2 from idle, 2 partition workers.
    batch = batch_proofs_per_hour(2, 2, 2, 6)
    assert batch == pytest.approx(model.steady_state_proofs_per_hour(2, 2, 2), rel=0.02)


def test_first_proof_figures_match_the_field_warmup() -> None:
    # No PCE, first after start, SRS load, extraction: the field's 359 s warmup at 2 workers.
    first = (
        model.steady_state_seconds_per_proof(2)
        * model.NO_PCE_SYNTHESIS_FACTOR
        * model.FIRST_PROOF_AFTER_START_FACTOR
        + model.PCE_EXTRACTION_SECONDS
        + model.srs_load_seconds("porep-32g")
    )
    assert first == pytest.approx(359, abs=2)


def test_budget_slots_from_memory() -> None:
    # (256 - 44 - 26) // 14 = 13, capped by max_parallel_synthesis.
    assert model.budget_partition_slots(256 * GIB, 18) == 13
    assert model.budget_partition_slots(256 * GIB, 10) == 10
    assert model.budget_partition_slots(50 * GIB, 18) == 1  # at least one


def test_srs_load_times_scale_with_size() -> None:
    assert model.srs_load_seconds("porep-32g") == 45.0
    assert model.srs_load_seconds("wpost-32g") > 45.0
    assert model.srs_load_seconds("winning-32g") == 1.0
