"""Restart policy: a capped backoff with jitter, a stable-run reset and a crash-loop verdict."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cuzk_supervisor.core.restart import (
    Failure,
    GiveUp,
    Restart,
    RestartHistory,
    RestartPolicy,
    backoff_s,
    jittered_backoff_s,
    next_restart,
    record_failure,
    record_healthy,
)

# Seconds-scale values, wide enough to hit the cap early and late, small enough to keep floats exact
# where the tests compare them.
seconds = st.floats(min_value=0.001, max_value=1000.0, allow_nan=False, allow_infinity=False)
rands = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
reasons = st.sampled_from(["crashed", "oom_killed", "killed", "failed_to_start"])


@st.composite
def policies(draw: st.DrawFn, min_failures: int = 1) -> RestartPolicy:
    initial = draw(seconds)
    return RestartPolicy(
        initial_backoff_s=initial,
        max_backoff_s=initial + draw(st.floats(min_value=0.0, max_value=1000.0)),
        multiplier=draw(st.floats(min_value=1.0, max_value=10.0)),
        jitter=draw(st.floats(min_value=0.0, max_value=1.0)),
        stable_after_s=draw(seconds),
        crash_loop_failures=draw(st.integers(min_value=min_failures, max_value=10)),
        crash_loop_window_s=draw(seconds),
    )


attempts = st.integers(min_value=1, max_value=10_000)


# --- the curve --------------------------------------------------------------------------------


@given(policies())
def test_curve_starts_at_the_initial_value(policy: RestartPolicy) -> None:
    assert backoff_s(policy, 1) == policy.initial_backoff_s


@given(policies(), attempts)
def test_curve_is_non_decreasing_and_capped(policy: RestartPolicy, attempt: int) -> None:
    here, after = backoff_s(policy, attempt), backoff_s(policy, attempt + 1)
    assert policy.initial_backoff_s <= here <= after <= policy.max_backoff_s


@given(policies(), attempts, rands)
def test_jitter_stays_within_its_bounds_and_under_the_cap(
    policy: RestartPolicy, attempt: int, rand: float
) -> None:
    base = backoff_s(policy, attempt)
    delay = jittered_backoff_s(policy, attempt, rand)
    assert 0 < delay <= base <= policy.max_backoff_s
    assert delay >= base * (1 - policy.jitter) * (1 - 1e-12)


@given(policies(min_failures=2), st.integers(min_value=1, max_value=50), rands)
def test_next_restart_follows_the_curve(policy: RestartPolicy, failures: int, rand: float) -> None:
    # Failures spaced further apart than the window never make a crash loop, so only the curve acts.
    history, now = RestartHistory(), 0.0
    for n in range(1, failures + 1):
        now += policy.crash_loop_window_s * 2
        history = record_failure(policy, history, now, "crashed")
        decision = next_restart(policy, history, now, rand)
        assert decision == Restart(jittered_backoff_s(policy, n, rand), n, "crashed")


# --- reset after a stable run ------------------------------------------------------------------


@given(
    policies(),
    st.lists(seconds, min_size=1, max_size=20),
    st.floats(min_value=0.0, max_value=1e5),
    rands,
    reasons,
)
def test_after_a_stable_period_the_next_delay_is_the_initial_one(
    policy: RestartPolicy, gaps: list[float], extra: float, rand: float, reason: str
) -> None:
    history, now = RestartHistory(), 0.0
    for gap in gaps:  # any run of failures, perhaps a long one
        now += gap
        history = record_failure(policy, history, now, "crashed")
    history = record_healthy(history, now)
    later = now + policy.stable_after_s + extra
    assume(later - now >= policy.stable_after_s)  # float addition may round down

    # A restart asked for while healthy (no failure since) starts from the bottom ...
    assert next_restart(policy, history, later, rand) == Restart(
        jittered_backoff_s(policy, 1, rand), 1, ""
    )
    # ... and so does the restart after the next failure.
    after = record_failure(policy, history, later, reason)
    assert after.attempt == 1
    assert after.failures == (Failure(later, reason),)
    decision = next_restart(policy, after, later, rand)
    if policy.crash_loop_failures == 1:
        assert decision == GiveUp(reason, 1, policy.crash_loop_window_s)
    else:
        assert decision == Restart(jittered_backoff_s(policy, 1, rand), 1, reason)


@given(policies(min_failures=3), st.floats(min_value=0.0, max_value=0.999))
def test_a_short_healthy_run_does_not_reset(policy: RestartPolicy, fraction: float) -> None:
    history = record_failure(policy, RestartHistory(), 0.0, "crashed")
    history = record_healthy(history, 0.0)
    now = policy.stable_after_s * fraction
    assume(now < policy.stable_after_s)
    history = record_failure(policy, history, now, "oom_killed")
    assert history.attempt == 2
    decision = next_restart(policy, history, now, 0.0)
    assert isinstance(decision, Restart)
    assert decision.attempt == 2


# --- crash loop --------------------------------------------------------------------------------


@given(
    policies(),
    st.lists(seconds, max_size=10),
    st.data(),
    reasons,
)
def test_n_failures_within_the_window_give_up_naming_the_last_reason(
    policy: RestartPolicy, earlier_gaps: list[float], data: st.DataObject, last: str
) -> None:
    history, now = RestartHistory(), 0.0
    for gap in earlier_gaps:  # whatever came before
        now += gap
        history = record_failure(policy, history, now, "crashed")
    # N failures inside one window: offsets from the first are within [0, window].
    offsets = sorted(
        data.draw(
            st.lists(
                st.floats(min_value=0.0, max_value=policy.crash_loop_window_s),
                min_size=policy.crash_loop_failures - 1,
                max_size=policy.crash_loop_failures - 1,
            )
        )
    )
    start = now + 1.0
    times = [start, *(start + offset for offset in offsets)]
    assume(times[-1] - times[0] <= policy.crash_loop_window_s)  # float addition may round up
    for n, t in enumerate(times, start=1):
        history = record_failure(policy, history, t, last if n == len(times) else "crashed")
    decision = next_restart(policy, history, times[-1], 0.5)
    assert decision == GiveUp(last, policy.crash_loop_failures, policy.crash_loop_window_s)
    assert last in decision.describe()


@given(policies(min_failures=2), st.lists(st.floats(1.001, 10.0), min_size=1, max_size=40), rands)
def test_failures_spread_wider_than_the_window_never_give_up(
    policy: RestartPolicy, stretches: list[float], rand: float
) -> None:
    # Every gap exceeds window / (N - 1): any N consecutive failures span more than the window.
    step = policy.crash_loop_window_s / (policy.crash_loop_failures - 1)
    history, now = RestartHistory(), 0.0
    for stretch in stretches:
        now += step * stretch
        history = record_failure(policy, history, now, "crashed")
        assert isinstance(next_restart(policy, history, now, rand), Restart)


@given(policies(), st.lists(seconds, max_size=60))
def test_history_stays_small(policy: RestartPolicy, gaps: list[float]) -> None:
    history, now = RestartHistory(), 0.0
    for gap in gaps:
        now += gap
        history = record_failure(policy, history, now, "crashed")
        assert len(history.failures) <= policy.crash_loop_failures
        assert all(now - f.at <= policy.crash_loop_window_s for f in history.failures)


# --- examples ------------------------------------------------------------------------------------


def test_default_policy_curve() -> None:
    policy = RestartPolicy()
    assert [backoff_s(policy, n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff_s(policy, 10**9) == 60  # no overflow however long it has been failing


def test_policy_is_a_printable_comparable_value() -> None:
    policy = RestartPolicy(max_backoff_s=30)
    assert policy == RestartPolicy(max_backoff_s=30.0)
    assert policy != RestartPolicy()
    assert "max_backoff_s=30" in repr(policy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.jitter = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_backoff_s", 0),
        ("initial_backoff_s", float("nan")),
        ("max_backoff_s", 0.5),
        ("multiplier", 0.9),
        ("jitter", -0.1),
        ("jitter", 1.5),
        ("stable_after_s", 0),
        ("crash_loop_failures", 0),
        ("crash_loop_failures", 2.5),
        ("crash_loop_failures", True),
        ("crash_loop_window_s", float("inf")),
        ("multiplier", "2"),
    ],
)
def test_invalid_policy_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"RestartPolicy.{field}"):
        RestartPolicy(**{field: value})  # type: ignore[arg-type]


def test_crash_loop_scenario() -> None:
    policy = RestartPolicy(jitter=0.0)
    history = RestartHistory()
    delays = []
    for t in (0.0, 10.0, 20.0, 30.0):
        history = record_failure(policy, history, t, "crashed")
        decision = next_restart(policy, history, t, 0.3)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
    assert delays == [1, 2, 4, 8]
    history = record_failure(policy, history, 40.0, "oom_killed")
    verdict = next_restart(policy, history, 40.0, 0.3)
    assert verdict == GiveUp("oom_killed", 5, 300.0)
    assert verdict.describe() == "crash loop: 5 failures within 300 s (last: oom_killed)"


def test_old_failures_leave_the_window() -> None:
    policy = RestartPolicy(jitter=0.0)
    history = RestartHistory()
    for t in (0.0, 1.0, 2.0, 3.0):
        history = record_failure(policy, history, t, "crashed")
    # The fifth failure comes after the first four left the window: back off, do not give up.
    history = record_failure(policy, history, 400.0, "crashed")
    assert next_restart(policy, history, 400.0, 0.0) == Restart(16.0, 5, "crashed")


def test_healthy_probes_do_not_move_healthy_since() -> None:
    history = record_healthy(RestartHistory(), 5.0)
    assert record_healthy(history, 9.0) == history
    assert history.healthy_since == 5.0


def test_jitter_shortens_the_delay() -> None:
    policy = RestartPolicy(jitter=0.5)
    history = record_failure(policy, RestartHistory(), 0.0, "crashed")
    history = record_failure(policy, history, 1.0, "crashed")  # attempt 2: base 2 s
    assert next_restart(policy, history, 1.0, 0.0).delay_s == 2.0  # type: ignore[union-attr]
    assert next_restart(policy, history, 1.0, 0.5).delay_s == 1.5  # type: ignore[union-attr]


def test_bad_inputs_are_rejected() -> None:
    policy = RestartPolicy()
    history = record_failure(policy, RestartHistory(), 10.0, "crashed")
    with pytest.raises(ValueError, match="monotonic"):
        record_failure(policy, history, 9.0, "crashed")
    with pytest.raises(ValueError, match="monotonic"):
        record_healthy(history, 9.0)
    with pytest.raises(ValueError, match="rand"):
        next_restart(policy, history, 10.0, 1.0)
    with pytest.raises(ValueError, match="attempt"):
        backoff_s(policy, 0)
