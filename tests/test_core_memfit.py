"""Stepping down to what fits (cuzk_supervisor.core.memfit) and the plateau that quiets the
trend."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.memfit import fit_workers
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
    args = {"limit": 960 * MIB, "base": 330 * MIB, "running_workers": 12, "target_headroom": 0.2}
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
