"""The escalation ladder (issue 34): say every change once, restart where a restart can help
(once per episode, a bounded number of times), tell the manager a broken machine's rate, or only
say where the ladder is capped."""

from __future__ import annotations

from cuzk_supervisor.core.health import (
    CRASH_LOOP,
    GPU_LOST,
    PROOFS_FAILING,
    STUCK,
    THROTTLED,
    Assessment,
    Finding,
    Level,
)
from cuzk_supervisor.core.healthladder import (
    LadderPolicy,
    LadderState,
    Restart,
    Say,
    Tell,
    climb,
    delivered_rate,
)

LOST = Finding(GPU_LOST, Level.BROKEN, 100.0, "GPU 0 fell off the bus (XID 79)", gpu=0,
               completed_since=5)  # fmt: skip
STUCK_ON_0 = Finding(STUCK, Level.DEGRADED, 50.0, "partition 3 stuck", restart_helps=True, gpu=0)
FAILING = Finding(PROOFS_FAILING, Level.BROKEN, 10.0, "3 failed", restart_helps=True,
                  completed_since=0)  # fmt: skip


def step(state: LadderState, at: float, *findings: Finding, policy: LadderPolicy | None = None,
         min_rate: float = 30.0, judged: bool = True) -> tuple[LadderState, tuple]:  # fmt: skip
    return climb(policy or LadderPolicy(), state, Assessment(at, findings), min_rate=min_rate,
                 judged=judged)  # fmt: skip


def test_healthy_says_nothing_and_every_change_is_said_once() -> None:
    state, actions = step(LadderState(), 0)
    assert actions == ()
    throttled = Finding(THROTTLED, Level.DEGRADED, 0.0, "GPU 0 held at 45%", gpu=0)
    state, actions = step(state, 10, throttled)
    assert actions == (Say(Level.DEGRADED, "degraded: GPU 0 held at 45%"),)
    state, actions = step(state, 20, throttled)
    assert actions == ()
    state, actions = step(state, 30)
    assert actions == (Say(Level.HEALTHY, "healthy again: nothing found"),)


def test_a_restart_once_per_episode_and_no_more_than_the_limit() -> None:
    policy = LadderPolicy(restart_limit=2, restart_window_s=1000)
    state, actions = step(LadderState(), 60, STUCK_ON_0, policy=policy)
    assert [type(a) for a in actions] == [Say, Restart]
    state, actions = step(state, 70, STUCK_ON_0, policy=policy)
    assert actions == ()  # the same episode: one restart for it
    second = Finding(STUCK, Level.DEGRADED, 80.0, "stuck again", restart_helps=True, gpu=0)
    state, actions = step(state, 80, second, policy=policy)
    assert [type(a) for a in actions] == [Say, Restart]
    third = Finding(STUCK, Level.DEGRADED, 90.0, "and again", restart_helps=True, gpu=0)
    state, actions = step(state, 90, third, policy=policy)
    assert isinstance(actions[-1], Say)
    assert "degraded, not restarted (2 restarts within" in actions[-1].text
    later = Finding(STUCK, Level.DEGRADED, 1200.0, "a day later", restart_helps=True, gpu=0)
    state, actions = step(state, 1200, later, policy=policy)
    assert isinstance(actions[-1], Restart)  # the window moved on


def test_a_lost_gpu_is_told_at_once_with_rate_zero() -> None:
    state, actions = step(LadderState(), 130, LOST)
    tell = actions[-1]
    assert isinstance(tell, Tell)
    assert tell.rate == 0.0
    assert "XID 79" in tell.reason
    assert state.told
    assert step(state, 140, LOST) == (state, ())  # told once, then nothing


def test_broken_that_a_restart_may_clear_is_restarted_first_then_told() -> None:
    state, actions = step(LadderState(), 1000, FAILING)
    assert isinstance(actions[-1], Restart)
    state, actions = step(state, 1100)
    assert actions == (Say(Level.HEALTHY, "healthy again: nothing found"),)
    after = Finding(PROOFS_FAILING, Level.BROKEN, 1200.0, "every proof fails, as before",
                    completed_since=0)  # fmt: skip
    state, actions = step(state, 1300, after)
    assert isinstance(actions[-1], Tell)
    assert actions[-1].rate == 0.0


def test_a_degraded_finding_restarted_for_that_turns_broken_is_told() -> None:
    first = Finding("ecc", Level.DEGRADED, 10.0, "ECC", restart_helps=True, gpu=0)
    state, actions = step(LadderState(), 20, first)
    assert isinstance(actions[-1], Restart)
    again = Finding("ecc", Level.BROKEN, 10.0, "ECC again after a restart", gpu=0, latest=50.0,
                    completed_since=0)  # fmt: skip
    _, actions = step(state, 60, again)
    assert isinstance(actions[-1], Tell)


def test_with_no_restart_left_broken_is_told_without_one() -> None:
    policy = LadderPolicy(restart_limit=0)
    _, actions = step(LadderState(), 1000, FAILING, policy=policy)
    assert isinstance(actions[-1], Tell)


def test_a_rate_the_manager_would_pass_is_not_sent() -> None:
    # 100 proofs in the 100 s since the finding began: 3600/h, above min_rate 30.
    busy = Finding(CRASH_LOOP, Level.BROKEN, 0.0, "x", completed_since=100)
    assert delivered_rate(busy, 100.0, 1.0) == 0.0  # a crash loop delivers nothing from now on
    ecc = Finding("ecc", Level.BROKEN, 0.0, "ECC twice", gpu=0, completed_since=100)
    assert delivered_rate(ecc, 100.0, 1.0) == 3600.0
    assert delivered_rate(ecc, 100.0, 200.0) == 18.0  # on the bench's (scaled) clock
    _, actions = step(LadderState(), 100, ecc)
    assert [type(a) for a in actions] == [Say, Say]
    assert "still delivers 3600.0 proofs/hour" in actions[-1].text


def test_what_it_delivers_now_counts_from_the_latest_evidence() -> None:
    # ECC in two daemon lives: 100 proofs between the first error and the second, none since.
    ecc = Finding("ecc", Level.BROKEN, 0.0, "ECC again after a restart", gpu=0, latest=90.0,
                  completed_since=0)  # fmt: skip
    assert delivered_rate(ecc, 100.0, 1.0) == 0.0
    _, actions = step(LadderState(), 100, ecc)
    assert isinstance(actions[-1], Tell)


def test_capped_ladders_only_say() -> None:
    for top in ("say", "restart"):
        policy = LadderPolicy(top=top)
        _, actions = step(LadderState(), 130, LOST, policy=policy)
        assert not any(isinstance(a, Tell) for a in actions)
        assert "not told (the ladder stops before telling the manager)" in actions[-1].text
    _, actions = step(LadderState(), 60, STUCK_ON_0, policy=LadderPolicy(top="say"))
    assert [type(a) for a in actions] == [Say]
    _, actions = step(LadderState(), 130, LOST, judged=False)
    assert "not told (no manager)" in actions[-1].text
