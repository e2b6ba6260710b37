"""Ship log lines to the manager's ``/api/log-push`` without ever holding up the supervisor.

- ``add_line`` is synchronous and cheap (no await, no I/O): it normalises the line and appends it
  to a bounded buffer. One background task (:meth:`LogShipper.run`) sends.
- Lines are batched per source (one body carries one ``X-Log-Source``), sent every
  ``flush_interval_s`` (2 s; in the run phase the lifecycle lengthens it with
  :meth:`LogShipper.set_flush_interval`, so a chatty daemon costs the manager about one request
  per tab per interval; jittered: the first wait anywhere in it, and again the first at a
  new interval, each later one varied by ``± jitter``, :mod:`cuzk_supervisor.core.jitter`)
  or as soon as a source has ``batch_bytes``/``batch_lines`` waiting.
- The drain is paced (DESIGN.md principle 9): at most ``drain_lines_per_s`` lines a second on
  average and ``batch_lines`` in one body (:class:`cuzk_supervisor.core.pace.Pace`), so a
  backlog left by an outage goes out over minutes, in full bodies, never back to back. The
  last flush when the shipper stops is bounded by its own deadline instead.
- No body exceeds 256 KiB (the manager silently drops the rest); a longer line is cut with a
  marker (:func:`cuzk_supervisor.adapters.logship.push.normalize_line`).
- The backlog is bounded to what the manager keeps for an instance (10,000 lines; and
  ``max_buffer_bytes``): past it the OLDEST lines are dropped and counted (the manager would
  drop them on arrival anyway). The next successful send first delivers one line saying how
  many were dropped (and logs a warning event).
- Each line is shipped once: a child's output goes raw under its own tab (a listener); its
  ``child.line`` events are not shipped again under ``setup``
  (:func:`~cuzk_supervisor.adapters.logship.lines.shipping_processor`).
- A send uses the manager client's retry rules (its one shared backoff) with the short
  log-push stop; when it still fails, the batch goes back to the buffer and the task pauses
  ``retry_pause_s`` (jittered): one task, so a dead manager never piles up work.
- No manager configured: the shipper is a no-op sink.

This module is the shipper (its settings, the producer side and the sending task). The pieces
that decide are pure and tested without I/O: the buffer and the dropped-lines warning
(:mod:`~cuzk_supervisor.adapters.logship.buffer`), the event-to-line rendering and the structlog
processor (:mod:`~cuzk_supervisor.adapters.logship.lines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from cuzk_supervisor.adapters.logship.buffer import LogBuffer, dropped_warning
from cuzk_supervisor.adapters.logship.lines import SUPERVISOR_SOURCE
from cuzk_supervisor.adapters.logship.push import MAX_BODY_BYTES, normalize_line
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import ManagerRejected, ManagerUnavailable
from cuzk_supervisor.core.checks import (
    POSITIVE,
    in_range,
    int_at_least,
    require_fields,
    require_relation,
)
from cuzk_supervisor.core.jitter import DEFAULT_SPREAD, MAX_SPREAD, JitteredSchedule, next_delay
from cuzk_supervisor.core.pace import Pace

__all__ = ["LogShipper", "ShipperSettings", "ShipperStats"]

log = structlog.get_logger("supervisor.logship")

MIB = 1024 * 1024


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShipperSettings:
    flush_interval_s: float = 2.0
    """Longest time a line waits before a send is attempted."""
    batch_bytes: int = 64 * 1024
    """A source with this many bytes waiting is sent at once, not at the next interval."""
    batch_lines: int = 500
    """Same, counted in lines."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest body sent (the manager reads 256 KiB at most)."""
    max_buffer_lines: int = 10_000
    """Lines kept while the manager is away (what the manager keeps of an instance); beyond it
    the oldest are dropped."""
    max_buffer_bytes: int = 16 * MIB
    """Bytes kept while the manager is away; beyond it the oldest are dropped."""
    retry_pause_s: float = 5.0
    """Pause after a send that failed (after its own retries) before trying again."""
    final_flush_s: float = 5.0
    """Time given to the last flush when the shipper stops."""
    drain_lines_per_s: float = 20.0
    """Pace of the drain: lines a second on average (``batch_lines`` at most at once)."""
    jitter: float = DEFAULT_SPREAD
    """Each wait (flush interval, retry pause) varied by up to this fraction either way."""

    def __post_init__(self) -> None:
        require_fields(
            self, ("flush_interval_s", "retry_pause_s", "final_flush_s", "drain_lines_per_s"),
            POSITIVE,
        )  # fmt: skip
        require_fields(self, ("jitter",), in_range(0, MAX_SPREAD))
        require_fields(self, ("max_body_bytes",), in_range(256, MAX_BODY_BYTES))
        require_fields(self, ("batch_bytes",), int_at_least(1))
        require_relation(self, "batch_bytes", "<=", "max_body_bytes")
        require_fields(self, ("batch_lines", "max_buffer_lines"), int_at_least(1))
        # One line (up to a whole body) must always fit in the buffer.
        require_relation(self, "max_buffer_bytes", ">=", "max_body_bytes")


# --- the shipper --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShipperStats:
    buffered_lines: int
    buffered_bytes: int
    sent_lines: int
    sent_bodies: int
    dropped_total: int
    dropped_unreported: int
    rejected_lines: int


class LogShipper:
    """Buffers lines (``add_line``) and sends them from one task (``run``).

    Lines added before the instance's uuid is known (:meth:`set_uuid`) wait in the buffer.
    ``add_line`` may be called from any thread; the rest belongs to the event loop. ``rng``
    draws the jitter (seeded in tests); ``clock`` paces the drain. Nothing is global: a process
    may run many shippers (the fleet benchmark).
    """

    def __init__(
        self,
        client: ManagerClient | None,
        settings: ShipperSettings | None = None,
        *,
        uuid: str | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings if settings is not None else ShipperSettings()
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._pace = Pace(self.settings.drain_lines_per_s, self.settings.batch_lines)
        self._flush_interval_s = self.settings.flush_interval_s
        self._next_interval: tuple[float, float] | None = None  # (from when, the interval)
        self.enabled = client is not None and not client.is_local
        self._uuid = uuid
        self._buffer = LogBuffer(self.settings.max_buffer_lines, self.settings.max_buffer_bytes)
        self._max_line = self.settings.max_body_bytes - 1
        self._lock = threading.Lock()  # add_line may come from a worker thread's log event
        self._wake = asyncio.Event()
        self._wake_requested = False
        self._stopped = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._sent_lines = 0
        self._sent_bodies = 0
        self._rejected_lines = 0

    # -- producer side: synchronous, never waits --

    def add_line(self, source: str, line: str) -> None:
        if not self.enabled:
            return
        text, size = normalize_line(line, self._max_line)
        if not size:
            return
        with self._lock:
            self._buffer.add(source, text, size)
            wake = not self._wake_requested and (
                self._buffer.source_bytes(source) >= self.settings.batch_bytes
                or self._buffer.source_lines(source) >= self.settings.batch_lines
            )
            if wake:
                self._wake_requested = True
        if wake:
            self._signal()

    def listener(self, source: str) -> Callable[[str], None]:
        """A line callback for one source (e.g. ``OutputPump.add_listener``)."""
        return functools.partial(self.add_line, source)

    def set_flush_interval(self, seconds: float, *, after_s: float = 0.0) -> None:
        """``after_s`` from now, a line waits at most about ``seconds`` (jittered) before it is
        sent, or until a full body of its source is waiting (the run phase: see the module
        docstring)."""
        if not seconds > 0:
            raise ValueError(f"flush interval must be > 0, got {seconds!r}")
        self._next_interval = (self._clock() + max(after_s, 0.0), seconds)

    def set_uuid(self, uuid: str) -> None:
        """The instance is registered: buffered lines can go now."""
        self._uuid = uuid
        with self._lock:
            self._wake_requested = True
        self._signal()

    @property
    def running(self) -> bool:
        """True once :meth:`run` has started and until :meth:`stop`."""
        return self._loop is not None and not self._stopped.is_set()

    def stats(self) -> ShipperStats:
        with self._lock:
            return ShipperStats(
                buffered_lines=self._buffer.lines,
                buffered_bytes=self._buffer.bytes,
                sent_lines=self._sent_lines,
                sent_bodies=self._sent_bodies,
                dropped_total=self._buffer.dropped_total,
                dropped_unreported=self._buffer.dropped,
                rejected_lines=self._rejected_lines,
            )

    def _signal(self) -> None:
        loop = self._loop
        if loop is None:
            return  # run() has not started; it sends what is waiting when it does
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    # -- sender side: the event loop --

    async def run(self) -> None:
        """The sending task; returns after :meth:`stop` and a last flush (``final_flush_s``)."""
        if not self.enabled:
            await self._stopped.wait()
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        with self._lock:
            if self._wake_requested:
                self._wake.set()  # asked for before this task started
        settings = self.settings
        flush = JitteredSchedule(self._flush_interval_s, settings.jitter, self._rng.random)
        while not self._stopped.is_set():
            upcoming = self._next_interval
            if upcoming is not None and self._clock() >= upcoming[0]:
                self._flush_interval_s, self._next_interval = upcoming[1], None
            flush.set_interval(self._flush_interval_s)  # a new one starts anywhere in it
            await _wait(self._wake, flush.delay())
            self._wake.clear()
            with self._lock:
                self._wake_requested = False
            if self._stopped.is_set():
                break
            shipped = await self._ship(None, paced=True)
            if shipped is False:
                # The manager is away: size wakes are ignored until the pause is over.
                pause = next_delay(settings.retry_pause_s, settings.jitter, self._rng.random())
                await _wait(self._stopped, pause)
            elif shipped is not True:
                # Paced: the next body once the pace allows it (a stop still ends the wait).
                await _wait(self._stopped, shipped)
        await self.flush(self.settings.final_flush_s)

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    async def flush(self, deadline_s: float | None = None) -> bool:
        """Send everything waiting now; True when the buffer is empty (or nothing to do)."""
        if not self.enabled:
            return True
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        return await self._ship(deadline) is True

    async def _ship(self, deadline: float | None, *, paced: bool = False) -> bool | float:
        """Send the dropped-lines warning, then batches oldest source first, until empty.

        Returns True when the buffer is empty, False when the manager stayed away (the batch is
        back in the buffer), and, ``paced``, the seconds to wait before the pace allows the
        next full body.
        """
        assert self.client is not None
        client = self.client
        async with self._send_lock:
            uuid = self._uuid
            if uuid is None:
                return True
            while True:
                if deadline is None:
                    if self._stopped.is_set():
                        return True  # run() takes over with its bounded final flush
                    stop_s = None
                else:
                    stop_s = deadline - time.monotonic()
                    if stop_s <= 0:
                        return False
                with self._lock:
                    dropped = self._buffer.dropped
                if dropped:
                    if not await self._send_dropped_warning(client, uuid, dropped, stop_s):
                        return False
                    continue
                with self._lock:
                    sources = self._buffer.sources_by_age()
                    if not sources:
                        return True
                    source = sources[0]
                    if paced:
                        # A full body's worth (or all there is), at the drain's pace.
                        want = min(self._buffer.source_lines(source), self.settings.batch_lines)
                        wait = self._pace.wait_s(self._clock(), want)
                        if wait > 0:
                            return wait
                    batch = self._buffer.take(
                        source, self.settings.max_body_bytes, self.settings.batch_lines
                    )
                if paced:
                    self._pace.spend(self._clock(), len(batch))
                try:
                    await client.push_logs(uuid, source, [e[1] for e in batch], stop_s=stop_s)
                except ManagerUnavailable:
                    with self._lock:
                        self._buffer.restore(source, batch)
                    return False
                except ManagerRejected as exc:
                    # A 4xx will not change on retry: drop this batch, keep shipping the rest.
                    with self._lock:
                        self._rejected_lines += len(batch)
                    log.warning(
                        "logship.rejected",
                        source=source,
                        lines=len(batch),
                        status=exc.status,
                        detail=exc.message,
                    )
                else:
                    with self._lock:
                        self._sent_lines += len(batch)
                        self._sent_bodies += 1

    async def _send_dropped_warning(
        self, client: ManagerClient, uuid: str, count: int, stop_s: float | None
    ) -> bool:
        try:
            await client.push_logs(uuid, SUPERVISOR_SOURCE, [dropped_warning(count)], stop_s=stop_s)
        except ManagerUnavailable:
            return False
        except ManagerRejected:
            pass  # counted as reported: retrying a 4xx would loop
        else:
            with self._lock:
                self._sent_lines += 1
                self._sent_bodies += 1
        with self._lock:
            self._buffer.acknowledge_dropped(count)
        # Logged after the lock is released: this event comes back through add_line.
        log.warning("logship.dropped_lines", count=count, detail=dropped_warning(count))
        return True


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
