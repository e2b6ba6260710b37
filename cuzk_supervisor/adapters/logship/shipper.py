"""Ship log lines to the manager's ``/api/log-push`` without ever holding up the supervisor, and
at a cost to the manager that does not depend on what the children write.

- ``add_line`` is synchronous and cheap (no await, no I/O): it normalises the line (cut at
  ``max_line_bytes`` with a marker) and appends it to a bounded buffer. One background task
  (:meth:`LogShipper.run`) pushes.
- It pushes in **turns**, one every ``interval_s`` of the phase's budget (jittered: the first
  anywhere in it, each later one varied by ``± jitter``, :mod:`cuzk_supervisor.core.jitter`):
  20 s before the run phase (the dashboard moves at least every 30 s), ``log_push_interval_s``
  (120 s) in the run phase (:meth:`LogShipper.enter_run_phase`). Each turn spends from a budget
  of requests and bytes a minute (:mod:`cuzk_supervisor.core.logbudget`): the supervisor's own
  tab first, then the other sources, the bytes shared so that every tab's milestones go before
  any tab's routine lines; each tab's milestones first, then its **newest** routine lines that
  fit (:mod:`cuzk_supervisor.core.logselect`), the rest summarised by one line that counts
  them by kind. Each line's class is given where it is made (``add_line``, a child's tab:
  :mod:`~cuzk_supervisor.adapters.logship.childtab`). Before the run phase 4 pushes and
  ``log_budget_bytes_per_min`` (12 KB) a minute, in it 1 push and
  ``log_run_budget_bytes_per_min`` (2.4 KB): whatever a fetch or a daemon writes (1,000 lines a
  second included), the pushes of a machine stay within that.
- A push is one attempt (the manager client's ``once``), none while the client's shared backoff
  holds requests back; a push that fails spends its tokens all the same and its lines go back
  to the buffer for the next turn: weather, an outage or a 404 page never bring the next push
  sooner, and never loop.
- The backlog is bounded to what the manager keeps for an instance (10,000 lines; and
  ``max_buffer_bytes``): past it the OLDEST routine lines are dropped and counted with the
  rest (a milestone only when no routine line is left).
- Stopping (:meth:`LogShipper.stop`) ends with **one** last turn (:meth:`flush`): the
  supervisor's tab first, the lines of at most ``final_requests`` tabs within ``final_bytes``,
  and each other tab with anything waiting as its count alone; one attempt each, within
  ``final_flush_s``; never a loop, whatever the manager answers.
- Each line is shipped once: a child's output goes raw under its own tab (a ChildTab); its
  ``child.line`` events are not shipped again under ``setup``
  (:func:`~cuzk_supervisor.adapters.logship.lines.shipping_processor`).
- No manager configured: the shipper is a no-op sink.

The pieces that decide are pure and tested without I/O: the budget (:mod:`cuzk_supervisor.core.
logbudget`), the buffer (:mod:`~cuzk_supervisor.adapters.logship.buffer`), the rendering
(:mod:`~cuzk_supervisor.adapters.logship.lines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from cuzk_supervisor.adapters.logship.buffer import Entry, LogBuffer
from cuzk_supervisor.adapters.logship.childtab import ChildTab
from cuzk_supervisor.adapters.logship.lines import SUPERVISOR_SOURCE
from cuzk_supervisor.adapters.logship.push import normalize_line
from cuzk_supervisor.adapters.logship.shipsettings import MIN_PUSH_BYTES, ShipperSettings
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import ManagerRejected, ManagerUnavailable
from cuzk_supervisor.core import logbudget
from cuzk_supervisor.core.jitter import JitteredSchedule
from cuzk_supervisor.core.logselect import SUMMARY_MAX_BYTES, Tally, summary_line
from cuzk_supervisor.core.pace import Pace

__all__ = ["LogShipper", "ShipperSettings", "ShipperStats"]

log = structlog.get_logger("supervisor.logship")


@dataclass(frozen=True, slots=True)
class ShipperStats:
    buffered_lines: int
    buffered_bytes: int
    sent_lines: int
    sent_bodies: int
    dropped_total: int
    """Lines dropped past the buffer's bounds."""
    skipped_total: int
    """Lines dropped past a turn's budget (summarised)."""
    rejected_lines: int
    failed_pushes: int


class LogShipper:
    """Buffers lines (``add_line``, from any thread) and pushes them from one task (``run``).

    Lines added before the instance's uuid is known (:meth:`set_uuid`) wait in the buffer. ``rng``
    draws the jitter; ``clock`` (the manager client's, by default) fills the budget's buckets.
    Nothing is global: a process may run many shippers (the fleet benchmark).
    """

    def __init__(
        self,
        client: ManagerClient | None,
        config: ShipperSettings | None = None,
        *,
        uuid: str | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.config = config if config is not None else ShipperSettings()
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock or (client.clock if client is not None else time.monotonic)
        self.enabled = client is not None and not client.is_local
        self._uuid = uuid
        self._buffer = LogBuffer(self.config.max_buffer_lines, self.config.max_buffer_bytes)
        self._lock = threading.Lock()  # add_line may come from a worker thread's log event
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._turn_lock = asyncio.Lock()
        self._run_from: float | None = None  # the run phase's budget from then on
        self.budget = self.config.budget(run_phase=False)
        self._requests = Pace(self.budget.requests_per_min / 60, self.budget.burst_requests)
        self._bytes = Pace(self.budget.bytes_per_min / 60, self.budget.burst_bytes)
        self._sent_lines = self._sent_bodies = self._rejected_lines = self._failed = 0

    # -- producer side: synchronous, never waits --

    def add_line(
        self, source: str, line: str, *, milestone: bool = False, kind: str = ""
    ) -> int | None:
        """Buffer one line of the tab ``source``, of its class (a milestone or routine; ``kind``
        names it in a summary); return its sequence number (None: not buffered)."""
        if not self.enabled:
            return None
        text, size = normalize_line(line, self.config.max_line_bytes)
        if not size:
            return None
        with self._lock:
            return self._buffer.add(source, text, size, kind or f"{source} lines", milestone)

    def promote(self, source: str, seqs: Iterable[int]) -> None:
        """Make those routine lines of ``source`` that still wait milestones (a child's last
        lines before its exit: ``ChildTab``)."""
        with self._lock:
            self._buffer.promote(source, seqs)

    def listener(self, source: str, kind: str = "") -> Callable[[str], None]:
        """A callback for routine lines of one source (``kind``: their name in a summary)."""

        def add(line: str) -> None:
            self.add_line(source, line, kind=kind)

        return add

    def child_tab(self, source: str, name: str, ready: re.Pattern[str] | None = None) -> ChildTab:
        """A child's output for the tab ``source`` (``OutputPump.add_sink``): its first and
        last lines of each run, its ``ready`` line and its error lines are milestones."""
        s = self.config
        return ChildTab(self, source, name, head=s.child_head_lines, tail=s.child_tail_lines,
                        ready=ready)  # fmt: skip

    def enter_run_phase(self, *, after_s: float | None = None) -> None:
        """``after_s`` from now (by default one turn of the earlier budget, so the run phase's
        first lines show soon), the run phase's budget: a turn every ``run_interval_s``."""
        wait = self.config.interval_s if after_s is None else max(after_s, 0.0)
        self._run_from = self._clock() + wait

    def set_uuid(self, uuid: str) -> None:
        """The instance is registered: buffered lines go at the next turn (not at once: a
        fleet registering in the same second does not push in that second too)."""
        self._uuid = uuid

    def stats(self) -> ShipperStats:
        with self._lock:
            return ShipperStats(
                buffered_lines=self._buffer.lines, buffered_bytes=self._buffer.bytes,
                sent_lines=self._sent_lines, sent_bodies=self._sent_bodies,
                dropped_total=self._buffer.dropped_total,
                skipped_total=self._buffer.skipped_total,
                rejected_lines=self._rejected_lines, failed_pushes=self._failed,
            )  # fmt: skip

    # -- sender side: the event loop --

    async def run(self) -> None:
        """The pushing task; returns after :meth:`stop` and one last turn (:meth:`flush`)."""
        if not self.enabled:
            await self._stopped.wait()
            return
        schedule = JitteredSchedule(self.budget.interval_s, self.config.jitter, self._rng.random)
        wait = 0.0  # the first turn at once: what was logged before the start goes
        while not self._stopped.is_set():
            await _wait(self._wake, wait)
            self._wake.clear()
            if self._stopped.is_set():
                break
            if self._run_from is not None and self._clock() >= self._run_from:
                self._run_from = None
                self._switch(self.config.budget(run_phase=True))
                schedule.set_interval(self.budget.interval_s)  # the first anywhere in it
            await self._turn(final=False, deadline=None)
            wait = schedule.delay()
        stats = self.stats()
        log.info("logship.last_turn", waiting=stats.buffered_lines, sent=stats.sent_lines,
                 summarised=stats.skipped_total + stats.dropped_total)  # fmt: skip
        await self.flush(self.config.final_flush_s, last=True)
        unsent = self.unsent()
        if unsent:  # the local log says what the dashboard never got, not even as a count
            log.warning("logship.unsent", lines_by_tab=unsent)

    def unsent(self) -> dict[str, int]:
        """Lines of each tab neither pushed nor counted in a pushed summary (after the last
        turn: what it had no push or no room for)."""
        with self._lock:
            waiting = self._buffer.waiting()
            counts = {s: self._buffer.source_lines(s) + self._buffer.skipped(s).lines
                      for s in waiting}  # fmt: skip
        return {s: n for s, n in counts.items() if n}

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    async def flush(
        self, deadline_s: float | None = None, *, last: bool = False, through: int | None = None
    ) -> bool:
        """One turn out of turn (the exit's, or a reason that must reach the manager before a
        report): the supervisor's tab first, at most ``final_requests`` pushes and ``final_bytes``,
        one attempt each, within ``deadline_s``. True when the manager took every body the turn
        sent (the older lines of a chatty tab may be summarised). The ``last`` turn (the
        shipper's stop) holds nothing back: what it does not send it counts, and every other tab
        with anything waiting is pushed once, as its count.

        ``through`` (a sequence number :meth:`add_line` returned for the supervisor's tab): turns
        go on until that line was taken, so a reason behind more waiting milestones than one turn
        carries still arrives before the report that follows it. Those milestones are bounded
        (``milestone_backlog_s`` of the budget), so the turns are too."""
        if not self.enabled:
            return True
        deadline = None if deadline_s is None else self._clock() + deadline_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(deadline_s):
                while True:
                    sent = self._sent_bodies
                    if not await self._turn(final=True, deadline=deadline, last=last):
                        return False
                    if through is None or not self._waits_through(through):
                        return True
                    if self._sent_bodies == sent:  # nothing more would go
                        return False
        return False

    def _waits_through(self, seq: int) -> bool:
        """Whether a line of the supervisor's tab numbered ``seq`` or older still waits."""
        with self._lock:
            return self._buffer.oldest_waiting(SUPERVISOR_SOURCE) <= seq

    def _switch(self, budget: logbudget.Budget) -> None:
        now = self._clock()
        self._requests.available(now)  # what was earned until now, at the old rate
        self._bytes.available(now)
        self.budget = budget
        self._requests.rate_per_s = budget.requests_per_min / 60
        self._requests.burst = budget.burst_requests
        self._bytes.rate_per_s, self._bytes.burst = budget.bytes_per_min / 60, budget.burst_bytes
        self._requests.tokens = min(self._requests.tokens, budget.burst_requests)
        self._bytes.tokens = min(self._bytes.tokens, budget.burst_bytes)

    async def _turn(self, *, final: bool, deadline: float | None, last: bool = False) -> bool:
        """Push what this turn's budget allows (see the module docstring); False when a push
        was not taken (the turn ends there)."""
        assert self.client is not None
        uuid = self._uuid
        if uuid is None:
            return True
        async with self._turn_lock:
            now = self._clock()
            with self._lock:
                waiting = self._buffer.waiting()
                order = logbudget.order_sources(waiting, SUPERVISOR_SOURCE)
                pending = {s: self._buffer.source_bytes(s) + _reserve(self._buffer, s)
                           for s in order}  # fmt: skip
                # A tab's milestones, with room for its summary line when lines are left out.
                milestones = {s: min(pending[s], _milestone_room(self._buffer, s)) for s in order}
            if final:
                pushes, room = self.config.final_requests, float(self.config.final_bytes)
            else:
                pushes, room = self._requests.available(now), self._bytes.available(now)
            chosen = order[: max(0, pushes)]
            shares = logbudget.share_by_class(
                {s: milestones[s] for s in chosen}, {s: pending[s] for s in chosen}, room
            )
            if last:
                # Every other tab with anything waiting is pushed too, as its count alone, and a
                # chosen one without room sends its count: lines pushed plus lines counted stays
                # every line written.
                shares.update(dict.fromkeys(order[len(chosen) :], 0))
                chosen = order
            for source in chosen:
                if shares[source] < min(MIN_PUSH_BYTES, pending[source]) and not last:
                    continue
                if not await self._push(uuid, source, shares[source], final, deadline, last):
                    return False
        return True

    async def _push(
        self, uuid: str, source: str, room: int, final: bool, deadline: float | None, last: bool
    ) -> bool:
        """One body of ``source``; False when the manager did not take it (the turn ends)."""
        assert self.client is not None
        hold = int(self.budget.bytes_per_min * self.config.milestone_backlog_s / 60)
        with self._lock:
            reserve = _reserve(self._buffer, source, room)
            entries = self._buffer.take(source, max(0, room - reserve), 0 if last else hold)
            skipped = self._buffer.take_skipped(source)
        lines = [entry.text for entry in entries]
        if skipped.lines:
            lines.insert(0, summary_line(skipped, self.budget.bytes_per_min))
        if not lines:
            return True
        size = sum(len(line.encode()) + 1 for line in lines)
        if not final:
            now = self._clock()
            self._requests.spend(now, 1)
            self._bytes.spend(now, size)
        stop_s = None if deadline is None else max(0.001, deadline - self._clock())
        try:
            await self.client.push_logs(uuid, source, lines, stop_s=stop_s)
        except ManagerUnavailable:
            self._put_back(source, entries, skipped)
            return False
        except ManagerRejected as exc:
            # The manager's JSON 400 (a request of ours it cannot take): sending it again cannot
            # help. Counted, not logged per batch: a line logged here would be pushed too.
            with self._lock:  # the lines its summary stood for too: they leave the count
                self._rejected_lines += len(entries) + skipped.lines
            log.debug("logship.rejected", source=source, lines=len(entries), detail=exc.message)
            return True
        except BaseException:
            self._put_back(source, entries, skipped)  # cancelled (the exit's deadline)
            raise
        with self._lock:
            self._sent_lines += len(lines)
            self._sent_bodies += 1
        return True

    def _put_back(self, source: str, entries: list[Entry], skipped: Tally) -> None:
        with self._lock:
            self._failed += 1
            self._buffer.restore(source, entries, skipped)


def _reserve(buffer: LogBuffer, source: str, room: int | None = None) -> int:
    """Bytes kept for the summary line: when lines were dropped, or will be (``room`` is less
    than what waits)."""
    will_drop = room is not None and buffer.source_bytes(source) > room
    return SUMMARY_MAX_BYTES + 1 if buffer.skipped(source).lines or will_drop else 0


def _milestone_room(buffer: LogBuffer, source: str) -> int:
    waiting = buffer.milestone_bytes(source)
    return waiting + SUMMARY_MAX_BYTES + 1 if waiting else 0


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
