"""The log shipper's pure pieces: the push wire format (normalised lines, bodies within
256 KiB), the bounded buffer and its counts, the event-to-line rendering, the settings' checks.
The shipper itself, on virtual time: test_logship.py."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.adapters.logship.buffer import FIRST_KEPT, Entry, LogBuffer
from cuzk_supervisor.adapters.logship.lines import event_to_line
from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.manager.client import (
    ManagerClient,
    encode_body,
    normalize_line,
    split_bodies,
)

# --- pure pieces --------------------------------------------------------------------------------


def test_normalize_keeps_a_short_line_and_counts_its_newline():
    assert normalize_line("proof done\n") == ("proof done", 11)
    assert normalize_line("é") == ("é", 3)
    assert normalize_line("") == ("", 0)
    assert normalize_line("\r\n") == ("", 0)


def test_normalize_makes_inner_newlines_visible():
    text, _ = normalize_line("panic:\n  at foo\r\n  at bar")
    assert text == "panic:\\n  at foo\\n  at bar"


def test_normalize_truncates_a_long_line_on_a_character_boundary_with_a_marker():
    text, size = normalize_line("é" * 1000, max_bytes=101)
    assert size <= 102
    assert len(text.encode()) + 1 == size
    assert text.startswith("é")
    cut = 2000 - len(text.split(" …")[0].encode())
    assert text.endswith(f" …[truncated {cut} bytes]")


@given(st.lists(st.text(max_size=300), max_size=40), st.integers(256, 2048))
def test_split_bodies_fits_the_limit_and_keeps_order(lines, limit):
    groups = split_bodies(lines, limit)
    assert all(len(encode_body(group)) <= limit for group in groups)
    expected = [normalize_line(line, limit - 1)[0] for line in lines]
    assert [line for group in groups for line in group] == [e for e in expected if e]


def add(buffer: LogBuffer, source: str, line: str, milestone: bool = False) -> int:
    return buffer.add(source, *normalize_line(line), kind="k", milestone=milestone)


def texts(entries: list[Entry]) -> list[str]:
    return [e.text for e in entries]


def test_buffer_drops_the_oldest_line_across_sources_and_counts_it_for_its_source():
    buffer = LogBuffer(max_lines=3, max_bytes=10_000)
    add(buffer, "setup", "s1")
    add(buffer, "cuzk", "c1")
    add(buffer, "setup", "s2")
    add(buffer, "cuzk", "c2")  # s1 goes
    assert buffer.dropped_total == 1
    assert (buffer.skipped("setup").lines, buffer.skipped("setup").bytes) == (1, 3)
    assert buffer.waiting() == {"cuzk": 2, "setup": 3}
    assert texts(buffer.take("setup", 1000, 0)) == ["s2"]
    assert texts(buffer.take("cuzk", 1000, 0)) == ["c1", "c2"]
    assert buffer.lines == buffer.bytes == 0
    assert buffer.waiting() == {"setup": 5}  # only its count is left to say


def test_past_its_bound_the_buffer_drops_routine_lines_before_any_milestone():
    buffer = LogBuffer(max_lines=3, max_bytes=10_000)
    add(buffer, "setup", "phase register", milestone=True)
    for n in range(5):
        add(buffer, "cuzk", f"c{n}")
    assert texts(buffer.take("setup", 1000, 0)) == ["phase register"]
    assert texts(buffer.take("cuzk", 1000, 0)) == ["c3", "c4"]
    assert buffer.skipped("cuzk").lines == 3


def test_with_only_milestones_the_bound_keeps_each_tabs_first_and_newest():
    buffer = LogBuffer(max_lines=FIRST_KEPT + 2, max_bytes=10_000)
    for n in range(50):
        add(buffer, "cuzk", f"exit {n:02d}", milestone=True)
    kept = texts(buffer.take("cuzk", 100_000, 0))
    assert kept == [f"exit {n:02d}" for n in [*range(FIRST_KEPT), 48, 49]]
    assert buffer.skipped("cuzk").milestones == 50 - FIRST_KEPT - 2


def test_buffer_is_bounded_in_bytes():
    buffer = LogBuffer(max_lines=1000, max_bytes=100)
    for n in range(50):
        add(buffer, "cuzk", f"line {n:04d}")  # 10 bytes each with the newline
    assert buffer.lines == 10
    assert buffer.bytes == 100
    assert (buffer.skipped("cuzk").lines, buffer.skipped("cuzk").bytes) == (40, 400)
    assert buffer.take("cuzk", 1000, 0)[0].text == "line 0040"


def test_take_keeps_what_fits_and_counts_the_older_lines_by_kind():
    buffer = LogBuffer(max_lines=100, max_bytes=10_000)
    for n in range(10):
        add(buffer, "cuzk", f"{n:09d}")  # 10 bytes each
    batch = buffer.take("cuzk", 35, 0)
    assert texts(batch) == ["000000007", "000000008", "000000009"]
    assert buffer.lines == 0
    assert buffer.skipped_total == 7
    tally = buffer.take_skipped("cuzk")
    assert (tally.lines, tally.bytes, tally.kinds) == (7, 70, {"k": 7})
    assert buffer.skipped("cuzk").lines == 0


def test_take_sends_the_milestones_first_and_holds_those_that_do_not_fit():
    buffer = LogBuffer(max_lines=100, max_bytes=10_000)
    add(buffer, "setup", "m1-------", milestone=True)  # 10 bytes each
    add(buffer, "setup", "r1-------")
    add(buffer, "setup", "m2-------", milestone=True)
    add(buffer, "setup", "r2-------")
    assert texts(buffer.take("setup", 30, 100)) == ["m1-------", "m2-------", "r2-------"]
    add(buffer, "setup", "m3-------", milestone=True)
    add(buffer, "setup", "m4-------", milestone=True)
    add(buffer, "setup", "r3-------")
    assert texts(buffer.take("setup", 10, 100)) == ["m3-------"]  # m4 waits, r3 is counted
    assert texts(buffer.take("setup", 100, 100)) == ["m4-------"]
    assert buffer.take_skipped("setup").lines == 2  # r1, r3


def test_promoted_lines_are_milestones():
    buffer = LogBuffer(max_lines=100, max_bytes=10_000)
    seqs = [add(buffer, "fetch", f"line {n:04d}") for n in range(10)]  # 10 bytes each
    assert buffer.promote("fetch", seqs[:1]) == 1
    assert buffer.promote("fetch", seqs[:1]) == 0  # already one
    assert buffer.milestone_bytes("fetch") == 10
    assert texts(buffer.take("fetch", 30, 0)) == ["line 0000", "line 0008", "line 0009"]


def test_restore_puts_back_the_lines_first_and_the_count():
    buffer = LogBuffer(max_lines=100, max_bytes=10_000)
    add(buffer, "a", "old")
    add(buffer, "a", "new")
    batch = buffer.take("a", 4, 0)
    count = buffer.take_skipped("a")
    add(buffer, "a", "newer")
    buffer.restore("a", batch, count)
    assert (buffer.skipped("a").lines, buffer.skipped("a").bytes) == (1, 4)
    assert texts(buffer.take("a", 1000, 0)) == ["new", "newer"]


def test_restored_lines_are_the_oldest_and_dropped_first_when_full():
    buffer = LogBuffer(max_lines=3, max_bytes=10_000)
    add(buffer, "a", "old1")
    add(buffer, "a", "old2")
    batch = buffer.take("a", 10_000, 0)
    for n in range(3):
        add(buffer, "b", f"new{n}")
    assert buffer.restore("a", batch) == 2
    assert (buffer.skipped("a").lines, buffer.skipped("a").bytes) == (2, 10)
    assert buffer.source_lines("a") == 0


def test_a_shipped_line_carries_the_head_of_a_long_structured_value_and_every_string():
    """The bench's whole measurement and a daemon's command line are detail: the dashboard gets
    their head and length (the local log keeps them); a reason, however long, goes whole."""
    reason = "broken: " + "x" * 400
    line = event_to_line(
        {"event": "bench.result", "rate": 84.7, "measurement": {"stretches": list(range(200))},
         "reason": reason},
        nested_chars=40,
    )  # fmt: skip
    whole = json.dumps({"stretches": list(range(200))}, separators=(",", ":"))
    assert f"measurement={whole[:40]}…[{len(whole):,} chars]" in line
    assert "rate=84.7" in line
    assert f'reason="{reason}"' in line
    assert whole in event_to_line(
        {"event": "bench.result", "measurement": {"stretches": list(range(200))}}
    )


def test_event_to_line_is_one_readable_line():
    line = event_to_line(
        {
            "timestamp": "2025-01-01T00:00:00Z",
            "level": "info",
            "event": "proof.done",
            "job_id": "abc",
            "wall_s": 1.5,
            "detail": 'two words "quoted"',
            "plan": {"workers": 2},
            "_record": object(),
        }
    )
    assert line == (
        "2025-01-01T00:00:00Z info proof.done job_id=abc wall_s=1.5 "
        'detail="two words \\"quoted\\"" plan={"workers":2}'
    )


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_line_bytes"):
        ShipperSettings(max_line_bytes=10)
    with pytest.raises(ValueError, match="jitter"):
        ShipperSettings(jitter=0.9)
    with pytest.raises(ValueError, match="bytes_per_min"):
        ShipperSettings(bytes_per_min=0)


# --- the shipper's edges, no time involved ----------------------------------------------


def test_add_line_is_synchronous():
    assert not inspect.iscoroutinefunction(LogShipper.add_line)


async def test_without_a_manager_the_shipper_is_a_no_op_sink():
    for client in (None, ManagerClient(None)):
        shipper = LogShipper(client)
        assert not shipper.enabled
        shipper.add_line("cuzk", "nowhere")
        assert shipper.stats().buffered_lines == 0
        assert await shipper.flush(0.1)
        task = asyncio.create_task(shipper.run())
        shipper.stop()
        await asyncio.wait_for(task, 1.0)


def test_the_backlog_is_bounded_to_what_the_manager_keeps():
    """The manager keeps 10,000 lines per instance: more held here would be thrown away."""
    from cuzk_supervisor.settings import Settings

    assert ShipperSettings().max_buffer_lines == 10_000
    assert Settings().log_buffer_lines == 10_000
