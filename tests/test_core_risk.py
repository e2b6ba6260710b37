"""OOM risk (levels with hysteresis from headroom, PSI and trend) and the step down after OOM."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import GiveUpOOM, PlanRefusal, WorkerPlan, plan_workers, step_down
from cuzk_supervisor.core.risk import (
    MemorySample,
    RiskAssessment,
    RiskLevel,
    RiskPolicy,
    assess_risk,
    sample_interval_s,
)
from cuzk_supervisor.core.units import GIB

OK, WARN, CRITICAL = RiskLevel.OK, RiskLevel.WARN, RiskLevel.CRITICAL
POLICY = RiskPolicy()
LIMIT = 100 * GIB


def at(fraction_used: float, t: float = 0.0, psi: float | None = None) -> MemorySample:
    return MemorySample(t=t, used_bytes=int(fraction_used * LIMIT), psi_some_avg10=psi)


def one(fraction_used: float, previous: RiskLevel = OK, psi: float | None = None) -> RiskAssessment:
    """A single sample: no trend, so only headroom and PSI decide."""
    return assess_risk([at(fraction_used, psi=psi)], LIMIT, previous, POLICY)


def walk(samples: list[MemorySample], start: RiskLevel = OK) -> list[RiskLevel]:
    """Feed samples one at a time (each alone: no trend), carrying the level as the watcher does."""
    level, out = start, []
    for s in samples:
        level = assess_risk([s], LIMIT, level, POLICY).level
        out.append(level)
    return out


def changes(levels: list[RiskLevel], start: RiskLevel) -> int:
    return sum(a != b for a, b in zip([start, *levels], levels, strict=False))


# --- headroom levels and hysteresis, one table ------------------------------------------------


@pytest.mark.parametrize(
    ("used", "previous", "expected"),
    [
        (0.50, OK, OK),
        (0.84, OK, OK),  # headroom 16 %: not yet below 15 %
        (0.86, OK, WARN),
        (0.82, WARN, WARN),  # headroom 18 %: still short of the 20 % exit
        (0.79, WARN, OK),  # headroom 21 %: past the exit
        (0.96, OK, CRITICAL),  # headroom 4 % < 5 %
        (0.93, CRITICAL, CRITICAL),  # 7 %: short of the 8 % exit
        (0.93, WARN, WARN),  # ... but 7 % does not enter critical from warn
        (0.91, CRITICAL, WARN),  # 9 %: leaves critical, still inside warn
        (0.70, CRITICAL, OK),  # far below: straight to ok
        (1.10, OK, CRITICAL),  # over the limit: negative headroom
    ],
)
def test_headroom_levels(used, previous, expected):
    a = one(used, previous)
    assert a.level == expected, a.reason
    assert a.changed == (expected != previous)
    assert a.previous == previous


def test_assessment_carries_the_numbers_that_caused_it():
    a = one(0.96)
    assert a.headroom_bytes == LIMIT - int(0.96 * LIMIT)
    assert a.headroom_fraction == pytest.approx(0.04)
    assert (a.used_bytes, a.limit_bytes) == (int(0.96 * LIMIT), LIMIT)
    assert a.slope_bytes_per_s is None
    assert a.seconds_to_limit is None
    assert a.psi_some_avg10 is None
    assert a.reason.startswith("critical (entered): headroom 4.0% < 5% enter")
    assert "\n" not in a.reason
    d = json.loads(json.dumps(a.to_dict()))
    assert d["risk"] == "critical"
    assert d["changed"] is True


def test_holding_reason_says_so():
    a = one(0.82, WARN)
    assert a.reason.startswith("warn (holding): headroom 18.0% ≤ 20% exit")
    assert not a.changed
    assert one(0.50).reason.startswith("ok: headroom 50 GiB (50.0%) of 100 GiB, not growing")


# --- hysteresis: a value oscillating around one threshold does not flap -----------------------


def oscillating(center: float, amplitude: float) -> st.SearchStrategy[list[float]]:
    return st.lists(
        st.floats(min_value=center - amplitude, max_value=center + amplitude), min_size=1
    )


@given(headrooms=oscillating(0.15, 0.049))
def test_headroom_around_the_warn_threshold_does_not_flap(headrooms):
    # Inside (10 %, 20 %): never back to ok once in warn, and never critical.
    levels = walk([at(1 - h) for h in headrooms])
    assert changes(levels, OK) <= 1
    assert CRITICAL not in levels
    assert (WARN in levels) == any(h < 0.15 for h in headrooms)


@given(headrooms=oscillating(0.05, 0.029))
def test_headroom_around_the_critical_threshold_does_not_flap(headrooms):
    # Inside (2.1 %, 7.9 %), starting in warn: once critical, it stays critical.
    levels = walk([at(1 - h) for h in headrooms], start=WARN)
    assert changes(levels, WARN) <= 1
    assert OK not in levels


@given(psis=oscillating(10.0, 4.9))
def test_psi_around_the_warn_threshold_does_not_flap(psis):
    levels = walk([at(0.5, psi=p) for p in psis])
    assert changes(levels, OK) <= 1
    assert CRITICAL not in levels


@given(psis=oscillating(40.0, 14.9))
def test_psi_around_the_critical_threshold_does_not_flap(psis):
    levels = walk([at(0.5, psi=p) for p in psis], start=WARN)
    assert changes(levels, WARN) <= 1
    assert OK not in levels


@given(
    used=st.floats(min_value=0.0, max_value=1.2),
    psi=st.none() | st.floats(min_value=0.0, max_value=100.0),
    previous=st.sampled_from(list(RiskLevel)),
)
def test_entering_does_not_depend_on_the_past_and_holding_never_escalates(used, psi, previous):
    fresh = one(used, OK, psi)
    after = one(used, previous, psi)
    # The previous level can keep a level up (hysteresis), never push it above itself or fresh.
    assert after.level.severity >= fresh.level.severity
    assert after.level.severity <= max(fresh.level.severity, previous.severity)


# --- the trend: time to reach the limit ---------------------------------------------------------


def linear(start: float, per_s: float, n: int = 11, dt: float = 1.0) -> list[MemorySample]:
    """Used fraction ``start + per_s × t`` at t = 0, dt, ..."""
    return [at(start + per_s * i * dt, t=i * dt) for i in range(n)]


def test_steady_usage_is_ok_with_no_time_to_limit():
    a = assess_risk(linear(0.5, 0.0), LIMIT, OK, POLICY)
    assert a.level == OK
    assert a.slope_bytes_per_s == pytest.approx(0.0, abs=1.0)
    assert a.seconds_to_limit is None
    assert "not growing" in a.reason


def test_time_to_limit_is_headroom_over_the_least_squares_slope():
    samples = linear(0.70, 0.01)  # 1 % of the limit per second, last at 80 %
    a = assess_risk(samples, LIMIT, OK, POLICY)
    assert a.slope_bytes_per_s == pytest.approx(0.01 * LIMIT, rel=1e-6)
    assert a.seconds_to_limit == pytest.approx(20.0, rel=1e-6)
    assert a.level == WARN  # 20 s < 30 s warn entry; headroom 20 % is inside the trusted zone
    assert "limit in 20.0 s < 30 s enter" in a.reason


def test_fast_growth_near_the_limit_is_critical_before_headroom_says_so():
    samples = linear(0.78, 0.01)  # last at 88 %: 12 % headroom, 12 s to the limit
    a = assess_risk(samples, LIMIT, OK, POLICY)
    assert a.seconds_to_limit == pytest.approx(12.0, rel=1e-6)
    assert a.level == WARN
    faster = linear(0.68, 0.02)  # last at 88 %: 6 s to the limit
    b = assess_risk(faster, LIMIT, OK, POLICY)
    assert b.seconds_to_limit == pytest.approx(6.0, rel=1e-6)
    assert b.level == CRITICAL
    assert "limit in 6.0 s < 10 s enter" in b.reason


def test_a_ramp_far_from_the_limit_is_not_acted_on():
    # Partitions start in bursts: growth that would reach the limit in 10 s is still a ramp
    # while half the limit is free; the trend is reported but not trusted there.
    a = assess_risk(linear(0.20, 0.01, n=11), LIMIT, OK, POLICY)
    assert a.seconds_to_limit == pytest.approx(70.0, rel=1e-6)
    steep = assess_risk(linear(0.0, 0.05, n=11), LIMIT, OK, POLICY)
    assert steep.seconds_to_limit == pytest.approx(10.0, rel=1e-6)
    assert steep.level == OK
    assert "ramp: trend not trusted" in steep.reason
    always = RiskPolicy(trend_max_headroom=1.0)
    assert assess_risk(linear(0.0, 0.06, n=11), LIMIT, OK, always).level == CRITICAL


def test_shrinking_usage_has_no_time_to_limit_and_levels_come_from_headroom():
    a = assess_risk(linear(0.99, -0.005), LIMIT, OK, POLICY)  # last at 94 %
    assert a.slope_bytes_per_s is not None
    assert a.slope_bytes_per_s < 0
    assert a.seconds_to_limit is None
    assert a.level == WARN  # 6 % headroom: warn, not critical (5 % not crossed)
    assert assess_risk(linear(0.99, -0.005), LIMIT, CRITICAL, POLICY).level == CRITICAL


def test_the_trend_needs_enough_samples_in_the_window():
    two = [at(0.80, t=0), at(0.89, t=1)]
    assert assess_risk(two, LIMIT, OK, POLICY).slope_bytes_per_s is None
    # Old samples outside the 10 s window do not count towards the rate.
    old = [at(0.10, t=0), at(0.10, t=1), at(0.10, t=2)]
    recent = [at(0.85, t=100), at(0.85, t=101)]
    a = assess_risk(old + recent, LIMIT, OK, POLICY)
    assert a.slope_bytes_per_s is None
    same_instant = [at(0.5, t=5), at(0.6, t=5), at(0.7, t=5)]
    assert assess_risk(same_instant, LIMIT, OK, POLICY).slope_bytes_per_s is None


def test_over_the_limit_and_growing_is_zero_seconds_away():
    samples = [at(1.0 + 0.01 * i, t=i) for i in range(5)]
    a = assess_risk(samples, LIMIT, OK, POLICY)
    assert a.headroom_bytes < 0
    assert a.seconds_to_limit == 0.0
    assert a.level == CRITICAL


@given(
    start=st.floats(min_value=0.0, max_value=0.99),
    per_s=st.floats(min_value=1e-4, max_value=0.05),
    n=st.integers(min_value=3, max_value=30),
)
def test_time_to_limit_property_for_linear_growth(start, per_s, n):
    samples = [
        MemorySample(t=float(i), used_bytes=int((start + per_s * i) * LIMIT)) for i in range(n)
    ]
    a = assess_risk(samples, LIMIT, OK, RiskPolicy(trend_window_s=1000.0))
    assert a.slope_bytes_per_s == pytest.approx(per_s * LIMIT, rel=1e-3, abs=16.0)
    assert a.slope_bytes_per_s is not None
    expected = max(0, LIMIT - samples[-1].used_bytes) / a.slope_bytes_per_s
    assert a.seconds_to_limit == pytest.approx(expected)


# --- PSI ---------------------------------------------------------------------------------------


def test_psi_escalates_and_comes_back_with_hysteresis():
    psis = [0.0, 12.0, 45.0, 30.0, 20.0, 7.0, 4.0]
    levels = walk([at(0.5, psi=p) for p in psis])
    assert levels == [OK, WARN, CRITICAL, CRITICAL, WARN, WARN, OK]


def test_psi_reason_names_the_value():
    a = one(0.5, OK, psi=45.0)
    assert a.level == CRITICAL
    assert "psi some avg10 45 > 40 enter" in a.reason
    assert a.psi_some_avg10 == 45.0


def test_the_worst_signal_wins():
    assert one(0.90, OK, psi=50.0).level == CRITICAL  # warn by headroom, critical by PSI
    assert one(0.97, OK, psi=0.0).level == CRITICAL


# --- sampling interval --------------------------------------------------------------------------


def test_sample_interval_is_fast_while_at_risk():
    assert sample_interval_s(one(0.5), POLICY) == 1.0
    assert sample_interval_s(one(0.9), POLICY) == 0.1
    assert sample_interval_s(one(0.99), POLICY) == 0.1
    custom = RiskPolicy(interval_s=2.0, fast_interval_s=0.25)
    assert sample_interval_s(one(0.5), custom) == 2.0
    assert sample_interval_s(one(0.9), custom) == 0.25


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"warn_exit_headroom": 0.10}, "warn_exit_headroom"),  # exit below enter
        ({"critical_exit_headroom": 0.01}, "critical_exit_headroom"),
        ({"critical_enter_headroom": 0.5, "critical_exit_headroom": 0.6}, "warn_enter_headroom"),
        ({"psi_warn_exit": 20.0}, "psi_warn_exit"),
        ({"psi_critical_exit": 50.0}, "psi_critical_exit"),
        ({"psi_warn_enter": 50.0, "psi_warn_exit": 5.0}, "psi_warn_enter"),
        ({"critical_exit_seconds_to_limit": 5.0}, "critical_exit_seconds_to_limit"),
        ({"warn_enter_seconds_to_limit": 5.0}, "warn_enter_seconds_to_limit"),
        ({"trend_min_samples": 1}, "trend_min_samples"),
        ({"trend_window_s": 0}, "trend_window_s"),
        ({"fast_interval_s": -1}, "fast_interval_s"),
        ({"warn_enter_headroom": math.nan}, "warn_enter_headroom"),
        ({"psi_critical_enter": 101}, "psi_critical_enter"),
    ],
)
def test_risk_policy_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"RiskPolicy\.{field} must be"):
        RiskPolicy(**kwargs)


def test_bad_samples_and_limits_are_rejected():
    with pytest.raises(ValueError, match="at least one sample"):
        assess_risk([], LIMIT, OK, POLICY)
    with pytest.raises(ValueError, match="time order"):
        assess_risk([at(0.5, t=2), at(0.5, t=1)], LIMIT, OK, POLICY)
    with pytest.raises(ValueError, match="limit_bytes"):
        assess_risk([at(0.5)], 0, OK, POLICY)
    with pytest.raises(ValueError, match=r"MemorySample\.used_bytes"):
        MemorySample(t=0, used_bytes=-1)
    with pytest.raises(ValueError, match=r"MemorySample\.psi_some_avg10"):
        MemorySample(t=0, used_bytes=0, psi_some_avg10=120.0)
    with pytest.raises(ValueError, match=r"MemorySample\.t"):
        MemorySample(t=math.inf, used_bytes=0)


def test_levels_are_printable_and_ordered_by_severity():
    assert [str(x) for x in RiskLevel] == ["ok", "warn", "critical"]
    assert sorted(RiskLevel, key=lambda x: x.severity) == [OK, WARN, CRITICAL]
    assert RiskLevel("warn") is WARN
    assert assess_risk([at(0.5)], LIMIT, "warn", POLICY).previous is WARN  # type: ignore[arg-type]


# --- step down after an OOM kill or a critical event -------------------------------------------

MEMORY = MemoryPolicy()


def full_plan(host_gib: int = 512) -> WorkerPlan:
    plan = plan_workers(PlanInputs(host_gib * GIB, gpu_vram_total_bytes=(24 * GIB,)), MEMORY)
    assert isinstance(plan, WorkerPlan)
    return plan


def test_step_down_one_at_a_time_to_one_then_give_up():
    plan: WorkerPlan | GiveUpOOM = full_plan()
    seen = []
    while isinstance(plan, WorkerPlan):
        seen.append(plan.full_workers)
        # Derived values are recomputed for every step.
        assert plan.partition_workers == plan.max_parallel_synthesis == plan.full_workers
        assert plan.warmup_workers == min(2, plan.full_workers)
        assert plan.total_budget_gib == 44 + 26 + 14 * plan.full_workers
        plan = step_down(plan, "oom_killed (signal 9, cgroup oom_kill +1)", MEMORY)
    assert seen == list(range(12, 0, -1))
    assert isinstance(plan, GiveUpOOM)
    assert plan.cause == "oom_killed (signal 9, cgroup oom_kill +1)"
    assert plan.reason == (
        "out of memory at 1 partition worker, nothing left to step down to: "
        "oom_killed (signal 9, cgroup oom_kill +1)"
    )
    assert len(plan.step_downs) == 12
    assert json.loads(json.dumps(plan.to_dict()))["give_up"] is True


def test_step_down_keeps_inputs_rule_and_notes_and_records_the_cause():
    plan = full_plan(256)
    lower = step_down(plan, "memory critical: headroom 4.0% < 5% enter", MEMORY)
    assert isinstance(lower, WorkerPlan)
    assert lower.full_workers == plan.full_workers - 1
    assert (lower.inputs, lower.limit, lower.rule, lower.notes) == (
        plan.inputs,
        plan.limit,
        plan.rule,
        plan.notes,
    )
    assert lower.reason("full_workers") == (
        "stepped down from 6 to 5 after: memory critical: headroom 4.0% < 5% enter"
    )
    assert lower.step_downs == ("memory critical: headroom 4.0% < 5% enter",)
    assert lower.to_dict()["step_downs"] == ["memory critical: headroom 4.0% < 5% enter"]
    assert lower.config_values() == {
        "partition_workers": 5,
        "total_budget_gib": 140,
        "max_parallel_synthesis": 5,
    }


def test_step_down_by_is_a_field_and_never_goes_below_one():
    by_five = MemoryPolicy(step_down_by=5)
    plan: WorkerPlan | GiveUpOOM = full_plan()
    seen = []
    while isinstance(plan, WorkerPlan):
        seen.append(plan.full_workers)
        plan = step_down(plan, "oom", by_five)
    assert seen == [12, 7, 2, 1]


@given(
    host_gib=st.integers(min_value=119, max_value=4096),
    by=st.integers(min_value=1, max_value=12),
)
def test_step_down_always_ends_in_give_up_within_bounded_steps(host_gib, by):
    policy = MemoryPolicy(step_down_by=by)
    first = full_plan(host_gib)
    start = first.full_workers
    plan: WorkerPlan | GiveUpOOM = first
    steps = 0
    while isinstance(plan, WorkerPlan):
        before = plan.full_workers
        plan = step_down(plan, "oom", policy)
        steps += 1
        if isinstance(plan, WorkerPlan):
            assert plan.full_workers == max(1, before - by)
    assert steps == math.ceil((start - 1) / by) + 1


def test_a_budget_note_does_not_outlive_the_step_down_that_fixes_it():
    # An override of 14 on 256 GiB (192 GiB limit): 70 + 14 × 14 = 266 GiB is cut to 192.
    plan: WorkerPlan | PlanRefusal | GiveUpOOM
    plan = plan_workers(PlanInputs(256 * GIB, workers_override=14), MEMORY)
    assert isinstance(plan, WorkerPlan)
    assert any(n.startswith("total_budget ") for n in plan.notes)
    while isinstance(plan, WorkerPlan) and plan.full_workers > 8:
        plan = step_down(plan, "oom", MEMORY)
    assert isinstance(plan, WorkerPlan)
    assert plan.total_budget_gib == 70 + 14 * 8  # 182 GiB fits again
    assert not any(n.startswith("total_budget ") for n in plan.notes)
    assert any("override 14 does not fit" in n for n in plan.notes)  # still true of the input


def test_a_step_up_to_a_plateau_is_not_a_trend_toward_the_limit():
    from cuzk_supervisor.core.risk import MemorySample, RiskLevel, RiskPolicy, assess_risk

    limit = 100 * 2**30
    # A burst from 60 to 88 GiB, then flat: 12% headroom (warn), not "limit in a second".
    samples = [MemorySample(t, 60 * 2**30) for t in range(3)]
    samples += [MemorySample(t, 88 * 2**30) for t in range(3, 8)]
    assessment = assess_risk(samples, limit, RiskLevel.OK, RiskPolicy())
    assert assessment.level is RiskLevel.WARN
    growing = [*samples, MemorySample(8, 91 * 2**30), MemorySample(9, 94 * 2**30)]
    assert assess_risk(growing, limit, RiskLevel.WARN, RiskPolicy()).level is RiskLevel.CRITICAL
