"""Which lines of a tab a push sends (core/logselect.py) and the class of a line where it is made
(core/lineclass.py): pure, exhaustively by property."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.lineclass import child_line, event_is_milestone, line_level
from cuzk_supervisor.core.logselect import SUMMARY_MAX_BYTES, Tally, select, summary_line

lines_st = st.lists(st.tuples(st.integers(1, 400), st.booleans()), max_size=60)
room_st = st.integers(0, 6000)


def _bytes(lines, indices):
    return sum(lines[i][0] for i in indices)


@given(lines_st, room_st, room_st)
def test_each_line_is_shipped_held_or_counted_once_and_order_is_kept(lines, room, hold_room):
    chosen = select(lines, room, hold_room)
    every = [*chosen.ship, *chosen.hold, *chosen.left_out]
    assert sorted(every) == list(range(len(lines)))  # shipped + held + counted = written
    for part in (chosen.ship, chosen.hold, chosen.left_out):
        assert list(part) == sorted(part)
    if chosen.ship and chosen.hold:
        assert max(chosen.ship) < min(chosen.hold)  # what waits is newer than what went
    assert _bytes(lines, chosen.ship) <= room
    assert _bytes(lines, chosen.hold) <= max(0, hold_room)
    assert all(lines[i][1] for i in chosen.hold)  # only milestones wait


@given(lines_st, room_st, room_st)
def test_no_milestone_is_dropped_while_a_routine_line_is_shipped(lines, room, hold_room):
    chosen = select(lines, room, hold_room)
    if any(not lines[i][1] for i in chosen.ship):
        assert all(i in chosen.ship for i, (_, milestone) in enumerate(lines) if milestone)


@given(lines_st, room_st, room_st)
def test_milestones_that_fit_all_go_with_the_newest_routine_lines_that_fit(lines, room, hold):
    milestones = [i for i, (_, m) in enumerate(lines) if m]
    chosen = select(lines, room, hold)
    if _bytes(lines, milestones) <= room:
        assert set(milestones) <= set(chosen.ship)
        shipped_routine = [i for i in chosen.ship if not lines[i][1]]
        counted = [i for i in chosen.left_out]
        assert all(lines[i][1] is False for i in counted)
        if shipped_routine and counted:
            assert max(counted) < min(shipped_routine)  # the newest routine lines went


@given(lines_st, room_st)
def test_the_last_push_keeps_the_first_and_the_last_milestones(lines, room):
    milestones = [i for i, (_, m) in enumerate(lines) if m]
    chosen = select(lines, room, 0)
    assert chosen.hold == ()
    if milestones and _bytes(lines, milestones) > room:
        shipped = [i for i in chosen.ship if lines[i][1]]
        assert shipped == [i for i in milestones if i in shipped]
        # what went is a head and a tail of the milestones: the middle is what was counted
        gone = [i for i in milestones if i not in shipped]
        if gone and shipped:
            head = [i for i in shipped if i < min(gone)]
            tail = [i for i in shipped if i > max(gone)]
            assert head + tail == shipped


def test_a_crash_loop_past_the_backlog_keeps_its_first_and_last_exits():
    lines = [(100, True)] * 20 + [(100, False)] * 5
    chosen = select(lines, 300, 500)
    assert chosen.ship == (0, 1, 2)
    assert chosen.hold == (15, 16, 17, 18, 19)
    assert chosen.left_out == tuple(range(3, 15)) + tuple(range(20, 25))


KINDS = ["proof.completed", "daemon INFO", "a", "b", "c", "d"]


@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 2000), st.booleans()),
                min_size=1, max_size=50))  # fmt: skip
def test_a_summary_counts_what_it_stands_for_and_fits(items):
    tally = Tally()
    for kind, size, milestone in items:
        tally.add(kind, size, milestone)
    line = summary_line(tally, 12_000)
    assert len(line.encode()) <= SUMMARY_MAX_BYTES
    found = re.match(r"\[([\d,]+) lines not pushed", line)
    assert found
    assert int(found.group(1).replace(",", "")) == len(items)
    assert sum(tally.kinds.values()) == tally.lines == len(items)


def test_a_summary_names_the_commonest_kinds_first():
    tally = Tally()
    for kind, count in (("proof.completed", 206), ("daemon INFO", 198), ("x", 3), ("y", 2),
                        ("z", 2), ("w", 1)):  # fmt: skip
        for _ in range(count):
            tally.add(kind, 100, kind == "x")
    line = summary_line(tally, 12_000)
    assert line.startswith("[412 lines not pushed (41.2 KB, 3 of them milestones)")
    assert line.endswith(": 206 proof.completed, 198 daemon INFO, 3 x, 2 y, 3 of 2 other kinds]")


def test_the_supervisors_events_by_level_and_name():
    assert event_is_milestone("phase.entered", "info")
    assert event_is_milestone("manager.bench_verdict", "info")
    assert event_is_milestone("anything.odd", "warning")
    assert event_is_milestone("anything.bad", "error")
    assert not event_is_milestone("proof.completed", "info")
    assert not event_is_milestone("supervisor.status", "info")
    assert not event_is_milestone("child.output_suppressed", "warning")  # chatter about chatter


def test_a_childs_lines_by_their_place_level_and_words():
    ready = re.compile(r"\bcuzk-daemon ready\b")
    info = "2026-01-01T00:00:00.000Z  INFO cuzk_core::engine: proof completed job_id=1"
    assert line_level(info) == "INFO"
    assert child_line(info, 0, "daemon", head=2) == (True, "daemon INFO")  # its first lines
    assert child_line(info, 2, "daemon", head=2) == (False, "daemon INFO")
    err = "2026-01-01T00:00:00.000Z ERROR cuzk_core::gpu: CUDA error 700"
    assert child_line(err, 99, "daemon", head=2) == (True, "daemon ERROR")
    line = "2026-01-01T00:00:00.000Z  INFO cuzk_daemon: cuzk-daemon ready, serving on x"
    assert child_line(line, 99, "daemon", head=2, ready=ready)[0]
    assert child_line("thread 'main' panicked at src/main.rs:1", 99, "daemon", head=0)[0]
    assert child_line("error: connection reset while fetching x", 9, "fetch", head=0) == (
        True, "fetch output",
    )  # fmt: skip
    assert child_line("  x.params: 10 of 20 bytes", 9, "fetch", head=0) == (False, "fetch output")
