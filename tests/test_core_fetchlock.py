"""Whose turn it is at the params lock: stop what nobody else will stop, wait for the rest,
give up after the wait (issue 46)."""

import pytest

from cuzk_supervisor.core.fetchlock import Holder, Turn, holder, turn, why


@pytest.mark.parametrize(
    ("locker", "running", "expected"),
    [
        (None, False, Holder.UNKNOWN),  # not visible from here
        (100, True, Holder.OURS),  # our pid: our fetch has ended, its straggler holds it
        (200, False, Holder.ORPHANED),  # gone, or a zombie nobody collected yet
        (200, True, Holder.ANOTHERS),  # running (or its pid reused: waited for, never stopped)
    ],
)
def test_the_holder_is_told_by_the_takers_pid_and_whether_it_runs(locker, running, expected):
    assert holder(locker, me=100, locker_running=running) is expected


@pytest.mark.parametrize(
    ("who", "waited_s", "expected"),
    [
        (Holder.ORPHANED, 0.0, Turn.STOP),
        (Holder.OURS, 0.0, Turn.STOP),
        (Holder.ANOTHERS, 0.0, Turn.WAIT),
        (Holder.UNKNOWN, 59.9, Turn.WAIT),
        (Holder.ANOTHERS, 60.0, Turn.WAIT),
        (Holder.ANOTHERS, 60.1, Turn.GIVE_UP),
        (Holder.ORPHANED, 60.1, Turn.GIVE_UP),  # stopped, and still held: stuck in the kernel
    ],
)
def test_stop_what_nobody_else_will_wait_for_the_rest_give_up_after_the_wait(
    who, waited_s, expected
):
    assert turn(who, waited_s, wait_s=60.0) is expected


def test_a_zero_wait_stops_a_dead_supervisors_fetch_and_gives_up_on_a_live_ones_after_a_look():
    assert turn(Holder.ORPHANED, 0.0, wait_s=0.0) is Turn.STOP
    assert turn(Holder.ANOTHERS, 0.0, wait_s=0.0) is Turn.WAIT
    assert turn(Holder.ANOTHERS, 0.02, wait_s=0.0) is Turn.GIVE_UP


def test_the_reason_names_the_taker():
    assert (
        why(Holder.ANOTHERS, 4242)
        == "supervisor 4242 (still running) is fetching into the same folder"
    )
    assert "4242, which is gone" in why(Holder.ORPHANED, 4242)
    assert "our fetch has ended" in why(Holder.OURS, 1)
