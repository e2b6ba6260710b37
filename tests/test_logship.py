"""The log shipper: pure batching and dropping, then the shipper against a scripted manager.

No sleeps synchronise anything: tests wait for what the fake manager received (an event, or a
poll with a deadline), and a manager that is "away" blocks or fails on command.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from pacehelpers import patient
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.logship.buffer import LogBuffer, dropped_warning
from cuzk_supervisor.adapters.logship.lines import event_to_line, shipping_processor
from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.manager.client import (
    MAX_BODY_BYTES,
    ManagerClient,
    ManagerRetry,
    encode_body,
    normalize_line,
    split_bodies,
)

URL = "http://manager.test"
FAST = ManagerRetry(backoff_base_s=0.001, backoff_max_s=0.005, log_stop_s=0.02)
# Nothing flushes on a timer unless a test asks for it.
QUIET = ShipperSettings(flush_interval_s=60.0, retry_pause_s=0.01, final_flush_s=2.0)


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


def add(buffer: LogBuffer, source: str, line: str) -> int:
    return buffer.add(source, *normalize_line(line))


def test_buffer_drops_the_oldest_line_across_sources():
    buffer = LogBuffer(max_lines=3, max_bytes=10_000)
    add(buffer, "setup", "s1")
    add(buffer, "cuzk", "c1")
    add(buffer, "setup", "s2")
    assert add(buffer, "cuzk", "c2") == 1  # s1 goes
    assert buffer.dropped == buffer.dropped_total == 1
    assert buffer.sources_by_age() == ["cuzk", "setup"]
    assert [e[1] for e in buffer.take("setup", 1000)] == ["s2"]
    assert [e[1] for e in buffer.take("cuzk", 1000)] == ["c1", "c2"]
    assert buffer.lines == buffer.bytes == 0


def test_buffer_is_bounded_in_bytes():
    buffer = LogBuffer(max_lines=1000, max_bytes=100)
    for n in range(50):
        add(buffer, "cuzk", f"line {n:04d}")  # 10 bytes each with the newline
    assert buffer.lines == 10
    assert buffer.bytes == 100
    assert buffer.dropped == 40
    assert buffer.take("cuzk", 1000)[0][1] == "line 0040"


def test_take_fills_one_body_and_restore_puts_it_back_first():
    buffer = LogBuffer(max_lines=100, max_bytes=10_000)
    for n in range(10):
        add(buffer, "cuzk", f"{n:09d}")  # 10 bytes each
    batch = buffer.take("cuzk", 35)
    assert [e[1] for e in batch] == ["000000000", "000000001", "000000002"]
    assert buffer.lines == 7
    buffer.restore("cuzk", batch)
    assert [e[1] for e in buffer.take("cuzk", 10_000)] == [f"{n:09d}" for n in range(10)]


def test_restored_lines_are_the_oldest_and_dropped_first_when_full():
    buffer = LogBuffer(max_lines=3, max_bytes=10_000)
    add(buffer, "a", "old1")
    add(buffer, "a", "old2")
    batch = buffer.take("a", 10_000)
    for n in range(3):
        add(buffer, "b", f"new{n}")
    assert buffer.restore("a", batch) == 2
    assert buffer.sources_by_age() == ["b"]


def test_acknowledging_dropped_keeps_later_drops():
    buffer = LogBuffer(max_lines=1, max_bytes=10_000)
    for line in ("a", "b", "c"):
        add(buffer, "x", line)
    assert buffer.dropped == 2
    buffer.acknowledge_dropped(1)
    assert buffer.dropped == 1
    assert buffer.dropped_total == 2


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


def test_settings_refuse_a_body_over_256_kib():
    with pytest.raises(ValueError, match="max_body_bytes"):
        ShipperSettings(max_body_bytes=MAX_BODY_BYTES + 1)


# --- the shipper --------------------------------------------------------------------------------


class LogManager:
    """Fake /api/log-push: records bodies; ``away`` makes it refuse connections; ``gate`` holds
    every request until it is opened."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.away = False
        self.gate: asyncio.Event | None = None
        self.received = asyncio.Event()
        self.attempts = 0

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.away:
            raise httpx.ConnectError("refused", request=request)
        assert request.headers["X-Instance-UUID"] == "u-1"
        self.bodies.append((request.headers["X-Log-Source"], request.content))
        self.received.set()
        return httpx.Response(204)

    def lines(self, source: str | None = None) -> list[str]:
        return [
            line
            for src, body in self.bodies
            if source is None or src == source
            for line in body.decode().splitlines()
        ]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``condition`` until true or fail after ``timeout_s`` (a deadline, not a sleep)."""
    deadline = time.monotonic() + patient(timeout_s)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)


class FixedDraws(random.Random):
    """A random source whose every draw is ``value`` (the jitter made predictable)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@contextlib.asynccontextmanager
async def running_shipper(
    settings: ShipperSettings = QUIET, uuid: str | None = "u-1", rng: random.Random | None = None
) -> AsyncIterator[tuple[LogShipper, LogManager]]:
    fake = LogManager()
    client = ManagerClient(URL, retry=FAST, transport=httpx.MockTransport(fake.handler))
    shipper = LogShipper(client, settings, uuid=uuid, rng=rng)
    task = asyncio.create_task(shipper.run())
    try:
        yield shipper, fake
    finally:
        shipper.stop()
        if fake.gate is not None:
            fake.gate.set()
        await asyncio.wait_for(task, 5.0)
        await client.aclose()


def test_add_line_is_synchronous():
    assert not inspect.iscoroutinefunction(LogShipper.add_line)


async def test_lines_are_batched_per_source_in_order():
    async with running_shipper() as (shipper, fake):
        for n in range(5):
            shipper.add_line("setup", f"setup {n}")
            shipper.add_line("cuzk", f"cuzk {n}")
        assert await shipper.flush(2.0)
    assert [source for source, _ in fake.bodies] == ["setup", "cuzk"]
    assert fake.lines("setup") == [f"setup {n}" for n in range(5)]
    assert fake.lines("cuzk") == [f"cuzk {n}" for n in range(5)]


async def test_a_full_batch_is_sent_without_waiting_for_the_interval():
    settings = ShipperSettings(flush_interval_s=60.0, batch_lines=3)
    async with running_shipper(settings) as (shipper, fake):
        for n in range(3):
            shipper.add_line("benchout", f"proof {n}")
        await asyncio.wait_for(fake.received.wait(), 5.0)
    assert fake.lines("benchout") == ["proof 0", "proof 1", "proof 2"]


async def test_a_lone_line_goes_at_the_next_interval():
    settings = ShipperSettings(flush_interval_s=0.02, retry_pause_s=0.01)
    async with running_shipper(settings) as (shipper, fake):
        shipper.add_line("benchdaemon", "ready")
        await asyncio.wait_for(fake.received.wait(), 5.0)
    assert fake.lines() == ["ready"]


async def test_no_body_exceeds_256_kib():
    async with running_shipper() as (shipper, fake):
        shipper.add_line("cuzk", "y" * 400_000)  # one line longer than a body
        for n in range(300):
            shipper.add_line("cuzk", f"{n:05d} " + "x" * 3000)
        assert await shipper.flush(5.0)
    assert len(fake.bodies) >= 5
    assert all(len(body) <= MAX_BODY_BYTES for _, body in fake.bodies)
    lines = fake.lines("cuzk")
    assert len(lines) == 301
    assert lines[0].startswith("y" * 1000)
    assert "truncated" in lines[0]
    assert [line[:5] for line in lines[1:]] == [f"{n:05d}" for n in range(300)]


async def test_oldest_lines_are_dropped_while_the_manager_is_away_and_reported_when_back():
    settings = ShipperSettings(flush_interval_s=60.0, retry_pause_s=0.01, max_buffer_lines=10)
    async with running_shipper(settings) as (shipper, fake):
        fake.away = True
        for n in range(25):
            shipper.add_line("cuzk", f"line {n}")
        assert not await shipper.flush(0.2)
        assert shipper.stats().dropped_unreported == 15
        fake.away = False
        with capture_logs() as logs:
            assert await shipper.flush(2.0)
    assert fake.bodies[0] == ("setup", (dropped_warning(15) + "\n").encode())
    assert dropped_warning(15).startswith("dropped the 15 oldest log lines")
    assert fake.lines("cuzk") == [f"line {n}" for n in range(15, 25)]
    warnings = [e for e in logs if e["event"] == "logship.dropped_lines"]
    assert len(warnings) == 1
    assert warnings[0]["count"] == 15
    assert shipper.stats().dropped_unreported == 0


async def test_the_background_task_recovers_by_itself_after_an_outage():
    settings = ShipperSettings(flush_interval_s=0.02, retry_pause_s=0.01, max_buffer_lines=5)
    async with running_shipper(settings) as (shipper, fake):
        fake.away = True
        for n in range(8):
            shipper.add_line("benchout", f"proof {n}")
        await wait_for(lambda: fake.attempts >= 3)
        fake.away = False
        await wait_for(lambda: len(fake.lines("benchout")) == 5)
    assert fake.lines("setup")[0] == dropped_warning(3)
    assert fake.lines("benchout") == [f"proof {n}" for n in range(3, 8)]


async def test_add_line_never_waits_for_a_stuck_manager():
    settings = ShipperSettings(flush_interval_s=0.01, max_buffer_lines=1000)
    async with running_shipper(settings) as (shipper, fake):
        fake.gate = asyncio.Event()  # every request hangs until the gate opens
        shipper.add_line("cuzk", "first")
        await wait_for(lambda: fake.attempts >= 1)
        # The sender is stuck on the gate; add_line runs to completion regardless.
        for n in range(20_000):
            shipper.add_line("cuzk", f"flood {n}")
        assert fake.attempts == 1
        assert not fake.gate.is_set()
        stats = shipper.stats()
        assert stats.buffered_lines == 1000  # bounded while the send is stuck
        assert stats.dropped_total == 19_000
        fake.gate.set()
        assert await shipper.flush(5.0)
    assert fake.lines("cuzk")[0] == "first"
    assert fake.lines("setup") == [dropped_warning(19_000)]
    assert fake.lines("cuzk")[1:] == [f"flood {n}" for n in range(19_000, 20_000)]


async def test_lines_wait_for_the_uuid():
    async with running_shipper(uuid=None) as (shipper, fake):
        shipper.add_line("setup", "before register")
        assert await shipper.flush(1.0)
        assert fake.bodies == []
        shipper.set_uuid("u-1")
        assert await shipper.flush(1.0)
    assert fake.lines() == ["before register"]


async def test_stop_flushes_what_is_left():
    fake_holder: list[LogManager] = []
    async with running_shipper() as (shipper, fake):
        fake_holder.append(fake)
        shipper.add_line("cuzk", "last words")
    assert fake_holder[0].lines() == ["last words"]


async def test_add_line_from_another_thread_wakes_the_sender():
    settings = ShipperSettings(flush_interval_s=60.0, batch_lines=2)
    async with running_shipper(settings) as (shipper, fake):
        # run() must own the loop already, so the thread has to hand the wake-up over.
        await wait_for(lambda: shipper.running)

        def add_two() -> None:
            for n in range(2):
                shipper.add_line("supervisor", f"t{n}")

        worker = threading.Thread(target=add_two)
        worker.start()
        worker.join()
        await asyncio.wait_for(fake.received.wait(), 5.0)
    assert fake.lines() == ["t0", "t1"]


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


async def test_structlog_events_are_shipped_as_supervisor_lines():
    async with running_shipper() as (shipper, fake):
        old = structlog.get_config()
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                shipping_processor(shipper),
                structlog.processors.KeyValueRenderer(),
            ],
            logger_factory=structlog.ReturnLoggerFactory(),
        )
        try:
            structlog.get_logger().info("daemon.ready", calls=3)
        finally:
            structlog.configure(**old)
        assert await shipper.flush(1.0)
    assert fake.lines("setup") == ["info daemon.ready calls=3"]


# --- fleet manners (issue 22) -------------------------------------------------------------------


async def test_the_backlog_is_bounded_to_what_the_manager_keeps_oldest_dropped_first():
    """The manager keeps 10,000 lines per instance: more held here would be thrown away on
    arrival. One line says how many of the oldest were dropped."""
    from cuzk_supervisor.settings import Settings

    assert ShipperSettings().max_buffer_lines == 10_000
    assert Settings().log_buffer_lines == 10_000
    async with running_shipper(ShipperSettings(flush_interval_s=60.0, retry_pause_s=0.01)) as (
        shipper,
        fake,
    ):
        fake.away = True
        for n in range(12_000):
            shipper.add_line("cuzk", f"line {n}")
        stats = shipper.stats()
        assert (stats.buffered_lines, stats.dropped_unreported) == (10_000, 2_000)
        fake.away = False
        assert await shipper.flush(10.0)
    assert fake.lines("setup") == [dropped_warning(2_000)]
    assert fake.lines("cuzk") == [f"line {n}" for n in range(2_000, 12_000)]


async def test_a_backlog_drains_at_the_set_pace_in_bodies_of_at_most_batch_lines():
    """After an outage the backlog goes out at ``drain_lines_per_s``, never back to back."""
    settings = ShipperSettings(flush_interval_s=0.01, retry_pause_s=0.01, batch_lines=50,
                               drain_lines_per_s=500.0)  # fmt: skip
    async with running_shipper(settings) as (shipper, fake):
        fake.away = True
        for n in range(300):
            shipper.add_line("cuzk", f"line {n}")
        await wait_for(lambda: fake.attempts >= 1)
        fake.away = False
        started = time.monotonic()
        await wait_for(lambda: len(fake.lines("cuzk")) == 300)
        elapsed = time.monotonic() - started
    bodies = [body.decode().splitlines() for source, body in fake.bodies if source == "cuzk"]
    assert all(len(lines) <= 50 for lines in bodies)
    assert len(bodies) >= 6
    # 300 lines, one burst of 50 at most held: at least 250 lines at 500 a second.
    assert elapsed >= 0.45  # a lower bound (the pace was kept), not a margin: slow only adds
    assert fake.lines("cuzk") == [f"line {n}" for n in range(300)]


def test_the_pace_and_the_jitter_are_checked_settings():
    with pytest.raises(ValueError, match="drain_lines_per_s"):
        ShipperSettings(drain_lines_per_s=0)
    with pytest.raises(ValueError, match="jitter"):
        ShipperSettings(jitter=0.9)


async def test_a_daemon_line_is_shipped_once_under_its_own_tab():
    """Before issue 22 every daemon line went twice: raw under its tab, and again as a
    ``child.line`` event under ``setup``."""
    from cuzk_supervisor.daemon.output import OutputPump

    async with running_shipper() as (shipper, fake):
        old = structlog.get_config()
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                shipping_processor(shipper),
                structlog.processors.KeyValueRenderer(),
            ],
            logger_factory=structlog.ReturnLoggerFactory(),
        )
        try:
            pump = OutputPump("cuzk", None)
            pump.add_listener(shipper.listener("cuzk"))
            reader = asyncio.StreamReader()
            reader.feed_data(b"\x1b[32mready\x1b[0m\nproving 1\n")
            reader.feed_eof()
            await pump.pump(reader, "stdout")
            structlog.get_logger().info("daemon.ready")
        finally:
            structlog.configure(**old)
        assert await shipper.flush(1.0)
    assert fake.lines("cuzk") == ["ready", "proving 1"]
    assert fake.lines("setup") == ["info daemon.ready"]


async def test_the_run_phase_batches_longer_a_line_waits_its_flush_interval():
    settings = ShipperSettings(flush_interval_s=0.02, retry_pause_s=0.01, jitter=0.0)
    # Every draw 0.5: the first wait at the new interval is half of it (30 s).
    draws = FixedDraws(0.5)
    async with running_shipper(settings, rng=draws) as (shipper, fake):
        shipper.add_line("cuzk", "before")
        await asyncio.wait_for(fake.received.wait(), 5.0)
        with pytest.raises(ValueError, match="flush interval"):
            shipper.set_flush_interval(0)
        shipper.set_flush_interval(60.0, after_s=0.1)  # the run phase, after its first 0.1 s
        shipper.add_line("cuzk", "in the grace")
        await wait_for(lambda: "in the grace" in fake.lines("cuzk"))
        await asyncio.sleep(0.15)  # the grace is over: the next wait is 30 s long
        fake.received.clear()
        shipper.add_line("cuzk", "steady 1")
        shipper.add_line("cuzk", "steady 2")
        await asyncio.sleep(0.3)
        assert fake.lines("cuzk") == ["before", "in the grace"]
    # The last flush when the shipper stops sends what waited.
    assert fake.lines("cuzk") == ["before", "in the grace", "steady 1", "steady 2"]
