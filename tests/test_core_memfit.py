"""Stepping down to what fits (cuzk_supervisor.core.memfit) and the plateau that quiets the
trend."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.memfit import MemoryFit, fit_workers, plateau_per_partition
from cuzk_supervisor.core.risk import MemorySample, RiskLevel, RiskPolicy, assess_risk

MIB = 2**20


def test_the_measured_partition_size_decides_the_workers():
    # 10 active at 930 MiB over a 330 MiB base: 60 MiB each; 960 MiB less 20% = 768 MiB.
    fit = fit_workers(limit=960 * MIB, base=330 * MIB, used=930 * MIB, active_partitions=10,
                      running_workers=12, target_headroom=0.20)  # fmt: skip
    assert fit is not None
    assert fit.per_partition == pytest.approx(60 * MIB)
    assert fit.workers == 7
    assert fit.plateau == 330 * MIB + 7 * 60 * MIB
    assert "60.0 MiB per active partition" in fit.reason


def test_a_fit_is_a_step_down_and_at_least_one_worker():
    big = fit_workers(limit=10_000 * MIB, base=100 * MIB, used=200 * MIB, active_partitions=2,
                      running_workers=4, target_headroom=0.2)  # fmt: skip
    assert big is not None
    assert big.workers == 3
    tiny = fit_workers(limit=400 * MIB, base=390 * MIB, used=500 * MIB, active_partitions=2,
                       running_workers=4, target_headroom=0.2)  # fmt: skip
    assert tiny is not None
    assert tiny.workers == 1


def test_no_fit_without_a_measurement():
    args: dict[str, Any] = {
        "limit": 960 * MIB,
        "base": 330 * MIB,
        "running_workers": 12,
        "target_headroom": 0.2,
    }
    assert fit_workers(used=930 * MIB, active_partitions=0, **args) is None
    assert fit_workers(used=300 * MIB, active_partitions=10, **args) is None


@given(
    base=st.integers(1, 500),
    per=st.integers(1, 100),
    active=st.integers(1, 20),
    running=st.integers(1, 24),
    limit=st.integers(100, 5000),
)
def test_the_fitted_plateau_keeps_the_target_headroom_unless_one_worker(
    base, per, active, running, limit
):
    fit = fit_workers(limit=limit * MIB, base=base * MIB, used=(base + per * active) * MIB,
                      active_partitions=active, running_workers=running,
                      target_headroom=0.2)  # fmt: skip
    assert fit is not None
    assert 1 <= fit.workers <= max(1, running - 1)
    if fit.workers > 1:
        assert fit.plateau <= limit * MIB * 0.8 + 1


def ramp(limit: int, start: int, step: int, n: int) -> list[MemorySample]:
    return [MemorySample(float(i) * 0.1, start + i * step, None) for i in range(n)]


def test_a_ramp_toward_a_plateau_that_fits_is_not_critical():
    policy = RiskPolicy()
    limit = 1000 * MIB
    samples = ramp(limit, 780 * MIB, 5 * MIB, 6)  # 80% and rising fast: the trend says soon
    alone = assess_risk(samples, limit, RiskLevel.OK, policy)
    assert alone.level is RiskLevel.CRITICAL
    quiet = assess_risk(samples, limit, RiskLevel.OK, policy, plateau_bytes=850 * MIB)
    assert quiet.level is not RiskLevel.CRITICAL
    # A plateau that does not fit below the critical headroom leaves the trend in charge.
    loud = assess_risk(samples, limit, RiskLevel.OK, policy, plateau_bytes=980 * MIB)
    assert loud.level is RiskLevel.CRITICAL


def test_the_plateau_never_hides_real_headroom_trouble():
    limit = 1000 * MIB
    samples = ramp(limit, 960 * MIB, 1 * MIB, 5)  # 3.6% headroom
    assessed = assess_risk(samples, limit, RiskLevel.OK, RiskPolicy(), plateau_bytes=500 * MIB)
    assert assessed.level is RiskLevel.CRITICAL


# --- a sample taken mid-ramp (the trend fired first) aims at the plateau ------------------------
#
# The cgroup end-to-end test's figures: an idle base of 336 MiB, 10 partitions of 60.3 MiB each
# (a plateau at 939 MiB), 960 MiB limit, 20% headroom kept. The model's partition is 14 simulated
# GiB at 4 MiB per GiB: 56 MiB. A sample at 780 MiB with the 10 counted active (most allocated,
# not all) measured 44.4 MiB per partition, and 9 fit; 7 fit at the plateau.

BASE, PER, ACTIVE, LIMIT, MODEL = 336 * MIB, 60.3 * MIB, 10, 960 * MIB, 56 * MIB


def old_fit(limit: int, base: int, used: int, active: int, running: int, headroom: float) -> int:
    """The fit before it aimed at the plateau: the measurement alone."""
    per = (used - base) / active
    room = limit * (1 - headroom) - base
    return max(1, min(running - 1, math.floor(room / per) if room > 0 else 0))


def fit_at(used: float, *, growing: bool, peak: float | None = None) -> MemoryFit:
    fit = fit_workers(limit=LIMIT, base=BASE, used=round(used), active_partitions=ACTIVE,
                      running_workers=12, target_headroom=0.20, growing=growing,
                      peak_per_partition=peak, model_per_partition=MODEL)  # fmt: skip
    assert fit is not None
    return fit


def test_a_mid_ramp_sample_plans_with_the_model_partition_not_the_low_measurement():
    measured_alone = old_fit(LIMIT, BASE, 780 * MIB, ACTIVE, 12, 0.20)
    assert measured_alone == 9  # what the e2e test ended on about 1 run in 4
    fit = fit_at(780 * MIB, growing=True)
    assert fit.measured_per_partition == pytest.approx(44.4 * MIB)
    assert (fit.per_partition, fit.source) == (MODEL, "model")
    assert fit.workers == 7
    assert fit.plateau == round(BASE + 7 * MODEL)
    assert "planned with the model's 56.0 MiB per partition" in fit.reason
    assert "(measured 44.4 MiB, model 56.0 MiB)" in fit.reason


def test_a_mid_ramp_sample_after_a_measured_plateau_plans_with_that_peak():
    fit = fit_at(780 * MIB, growing=True, peak=PER)
    assert (fit.per_partition, fit.source) == (PER, "earlier peak")
    assert fit.workers == fit_at(BASE + ACTIVE * PER, growing=False).workers == 7


def test_a_plateau_sample_gives_the_same_answer_as_before():
    at_plateau = BASE + ACTIVE * PER
    for growing in (False, True):  # the trend's window still holds the ramp: growing too
        fit = fit_at(at_plateau, growing=growing)
        assert fit.source == "measured"
        assert fit.per_partition == pytest.approx(PER)
        assert fit.workers == old_fit(LIMIT, BASE, round(at_plateau), ACTIVE, 12, 0.20) == 7


def test_a_level_sample_is_the_measurement_alone_even_below_the_model():
    # Memory not growing: a plateau, whatever the model says (a smaller proof, a smaller host).
    fit = fit_at(BASE + ACTIVE * 30 * MIB, growing=False)
    assert (fit.per_partition, fit.source) == (pytest.approx(30 * MIB), "measured")
    assert "memory still growing" not in fit.reason


def test_the_plateau_figure_is_the_largest_known_while_growing():
    assert plateau_per_partition(10.0, growing=False, peak=50.0, model=40.0).bytes == 10.0
    assert plateau_per_partition(10.0, growing=True, peak=50.0, model=40.0).source == "earlier peak"
    assert plateau_per_partition(10.0, growing=True, peak=None, model=40.0).bytes == 40.0
    assert plateau_per_partition(60.0, growing=True, peak=50.0, model=40.0).source == "measured"
    alone = plateau_per_partition(10.0, growing=True)
    assert (alone.bytes, alone.source) == (10.0, "measured")


ramp_case = {
    "base": st.integers(1, 2000),
    "true_per": st.integers(10, 200),
    "active": st.integers(1, 20),
    "running": st.integers(2, 24),
    "headroom_pct": st.integers(0, 40),
    "limit": st.integers(100, 20_000),
    "allocated": st.floats(0.05, 1.0),
}


@given(**ramp_case, model_share=st.floats(0.5, 1.0))
def test_a_mid_ramp_sample_never_plans_more_than_the_plateau_at_the_model_figure(
    base, true_per, active, running, headroom_pct, limit, allocated, model_share
):
    """The partitions have allocated ``allocated`` of their memory at the sample, and the model
    is at most their true size: the fit plans no more than the model's figure allows, nor more
    than the measurement alone said (it only ever plans fewer)."""
    headroom = headroom_pct / 100
    per, model = true_per * MIB, true_per * model_share * MIB
    used = round(base * MIB + active * per * allocated) + 1
    kw: dict[str, Any] = {
        "limit": limit * MIB, "base": base * MIB, "used": used, "active_partitions": active,
        "running_workers": running, "target_headroom": headroom,
    }  # fmt: skip
    fit = fit_workers(**kw, growing=True, model_per_partition=model)
    assert fit is not None
    alone = old_fit(limit * MIB, base * MIB, used, active, running, headroom)
    assert fit.workers <= alone
    room = limit * MIB * (1 - headroom) - base * MIB
    assert fit.workers <= max(1, math.floor(room / model) if room > 0 else 0)
    # With the true size measured earlier, the ramp plans what the plateau would.
    with_peak = fit_workers(**kw, growing=True, peak_per_partition=per)
    at_plateau = fit_workers(**{**kw, "used": base * MIB + active * per}, growing=False)
    assert with_peak is not None
    assert at_plateau is not None
    assert with_peak.workers <= at_plateau.workers


@given(**ramp_case, model_share=st.floats(0.1, 1.0), growing=st.booleans())
def test_a_plateau_sample_at_or_above_the_model_plans_as_before(
    base, true_per, active, running, headroom_pct, limit, allocated, model_share, growing
):
    del allocated  # a plateau: everything allocated
    headroom = headroom_pct / 100
    used = base * MIB + active * true_per * MIB
    fit = fit_workers(limit=limit * MIB, base=base * MIB, used=used, active_partitions=active,
                      running_workers=running, target_headroom=headroom, growing=growing,
                      model_per_partition=true_per * model_share * MIB)  # fmt: skip
    assert fit is not None
    assert fit.source == "measured"
    assert fit.workers == old_fit(limit * MIB, base * MIB, used, active, running, headroom)
