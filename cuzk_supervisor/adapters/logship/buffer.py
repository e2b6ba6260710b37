"""The log shipper's buffer: lines waiting to be pushed, per source (a dashboard tab), each a
milestone or a routine line with its kind (:mod:`cuzk_supervisor.core.lineclass`), bounded in
lines and bytes, and per source a tally of the lines left out (summarised in its next body).
Pure: no I/O, no clock, no lock (the shipper holds one around it).

The line bound is what the manager keeps of an instance (10,000 lines): a backlog past it would
be thrown away on arrival. Past either bound the OLDEST ROUTINE line (across sources) goes; only
when no routine line waits does a milestone go, never one of a tab's first :data:`FIRST_KEPT`
waiting (the start of its story) nor its newest (the end). A push takes what
:func:`cuzk_supervisor.core.logselect.select` chooses; every line left out is counted by kind.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from cuzk_supervisor.core.logselect import Tally, select

__all__ = ["FIRST_KEPT", "Entry", "LogBuffer"]

FIRST_KEPT = 10
"""A tab's oldest waiting milestones that the buffer's bound never evicts."""


class Entry(NamedTuple):
    seq: int
    text: str
    size: int
    """In a body, its newline included."""
    kind: str
    milestone: bool


class _Tab:
    __slots__ = ("bytes", "milestone_bytes", "milestones", "routine")

    def __init__(self) -> None:
        self.milestones: deque[Entry] = deque()
        self.routine: deque[Entry] = deque()
        self.bytes = 0
        self.milestone_bytes = 0

    def __len__(self) -> int:
        return len(self.milestones) + len(self.routine)

    def oldest(self) -> int:
        return min(q[0].seq for q in (self.milestones, self.routine) if q)

    def put(self, entry: Entry) -> None:
        (self.milestones if entry.milestone else self.routine).append(entry)
        self.bytes += entry.size
        if entry.milestone:
            self.milestone_bytes += entry.size

    def all(self) -> list[Entry]:
        return list(heapq.merge(self.milestones, self.routine))


class LogBuffer:
    """Lines waiting to be pushed, per source, bounded in lines and bytes. Each line has a global
    sequence number, so "oldest" is across sources. Eviction looks at the head of each source's
    queues: O(number of sources), a handful."""

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._tabs: dict[str, _Tab] = {}
        self._skipped: dict[str, Tally] = {}
        self._seq = 0
        self.lines = 0
        self.bytes = 0
        self.dropped_total = 0
        """Lines dropped past the buffer's bounds."""
        self.skipped_total = 0
        """Lines left out of a push (past a turn's budget)."""

    def add(
        self, source: str, text: str, size: int, kind: str = "", milestone: bool = False
    ) -> int:
        """Append one normalised line; return its sequence number. (The flood's path: flat.)"""
        self._seq += 1
        self._put(source, Entry(self._seq, text, size, kind or "lines", milestone))
        if self.lines > self.max_lines or self.bytes > self.max_bytes:
            self._evict()
        return self._seq

    def _put(self, source: str, entry: Entry) -> None:
        tab = self._tabs.get(source)
        if tab is None:
            tab = self._tabs[source] = _Tab()
        tab.put(entry)
        self.lines += 1
        self.bytes += entry.size

    def promote(self, source: str, seqs: Iterable[int]) -> int:
        """Make the routine lines ``seqs`` of ``source`` still waiting milestones (a child's
        last lines, once its exit is seen); return how many were."""
        tab = self._tabs.get(source)
        wanted = set(seqs)
        if tab is None or not wanted:
            return 0
        moved = [e for e in tab.routine if e.seq in wanted]
        if not moved:
            return 0
        tab.routine = deque(e for e in tab.routine if e.seq not in wanted)
        promoted = [e._replace(milestone=True) for e in moved]
        tab.milestones = deque(heapq.merge(tab.milestones, promoted))
        tab.milestone_bytes += sum(e.size for e in promoted)
        return len(promoted)

    def source_lines(self, source: str) -> int:
        tab = self._tabs.get(source)
        return len(tab) if tab is not None else 0

    def source_bytes(self, source: str) -> int:
        tab = self._tabs.get(source)
        return tab.bytes if tab is not None else 0

    def milestone_bytes(self, source: str) -> int:
        tab = self._tabs.get(source)
        return tab.milestone_bytes if tab is not None else 0

    def waiting(self) -> dict[str, int]:
        """Sources with lines waiting or lines to summarise, and the sequence number of their
        oldest line (a source with only a count: after every line)."""
        out = {s: tab.oldest() for s, tab in self._tabs.items()}
        for source in self._skipped:
            out.setdefault(source, self._seq + 1)
        return out

    def oldest_waiting(self, source: str) -> int:
        """The sequence number of ``source``'s oldest waiting line (past every line: none)."""
        tab = self._tabs.get(source)
        return tab.oldest() if tab else self._seq + 1

    def skipped(self, source: str) -> Tally:
        """Lines of ``source`` left out and not yet summarised."""
        return self._skipped.get(source, Tally())

    def take(self, source: str, room: int, hold_room: int) -> list[Entry]:
        """Remove and return what a push of ``source`` sends within ``room`` bytes (oldest
        first, :func:`~cuzk_supervisor.core.logselect.select`); milestones that do not fit
        wait, up to ``hold_room`` bytes of them; the rest is counted as skipped."""
        tab = self._tabs.pop(source, None)
        if tab is None:
            return []
        entries = tab.all()
        chosen = select([(e.size, e.milestone) for e in entries], room, hold_room)
        self.lines -= len(entries)
        self.bytes -= tab.bytes
        for index in chosen.hold:
            self._put(source, entries[index])
        for index in chosen.left_out:
            self._count(source, entries[index])
        self.skipped_total += len(chosen.left_out)
        return [entries[index] for index in chosen.ship]

    def take_skipped(self, source: str) -> Tally:
        """The tally to summarise now (reset; :meth:`restore` puts it back)."""
        return self._skipped.pop(source, Tally())

    def restore(self, source: str, entries: list[Entry], skipped: Tally | None = None) -> int:
        """Put back what a push could not deliver: its lines (in their places by age) and its
        tally; return the lines dropped to make room."""
        if skipped is not None and skipped.lines:
            self._skipped.setdefault(source, Tally()).merge(skipped)
        if not entries:
            return 0
        waiting = self._tabs.pop(source, _Tab()).all()
        self.lines -= len(waiting)
        self.bytes -= sum(e.size for e in waiting)
        for entry in heapq.merge(entries, waiting):
            self._put(source, entry)
        return self._evict()

    def _evict(self) -> int:
        evicted = 0
        while self.lines > self.max_lines or self.bytes > self.max_bytes:
            source, entry = self._victim()
            size = entry[2]
            self.lines -= 1
            self.bytes -= size
            tab = self._tabs[source]
            tab.bytes -= size
            if entry[4]:
                tab.milestone_bytes -= size
            if not (tab.routine or tab.milestones):
                del self._tabs[source]
            tally = self._skipped.get(source)
            if tally is None:
                tally = self._skipped[source] = Tally()
            tally.add(entry[3], size, entry[4])
            evicted += 1
        self.dropped_total += evicted
        return evicted

    def _victim(self) -> tuple[str, Entry]:
        """The oldest routine line across sources; else the milestone after the first
        :data:`FIRST_KEPT` of the tab with most of them (never its newest); removed."""
        heads = [(tab.routine[0][0], s) for s, tab in self._tabs.items() if tab.routine]
        if heads:
            source = min(heads)[1] if len(heads) > 1 else heads[0][1]
            return source, self._tabs[source].routine.popleft()
        source = max(self._tabs, key=lambda s: len(self._tabs[s].milestones))
        queue = self._tabs[source].milestones
        at = max(0, min(FIRST_KEPT, len(queue) - 2))
        entry = queue[at]
        del queue[at]
        return source, entry

    def _count(self, source: str, entry: Entry) -> None:
        self._skipped.setdefault(source, Tally()).add(entry.kind, entry.size, entry.milestone)
