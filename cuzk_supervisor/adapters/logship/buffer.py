"""The log shipper's buffer: lines waiting to be pushed, per source, bounded in lines and bytes,
and per source the count of lines that were not pushed (summarised in its next body). Pure: no
I/O, no clock, no lock (the shipper holds one around it).

The line bound is what the manager keeps of an instance (10,000 lines): a backlog past it would
be thrown away on arrival. Past either bound the OLDEST lines (across sources) are dropped; a
turn of the shipper takes a source's NEWEST lines that fit its budget and drops the older ones
(:mod:`cuzk_supervisor.core.logbudget`). Either way the dropped lines of a source are counted
(:meth:`LogBuffer.skipped`), and that count is one line at the head of the source's next body.
"""

from __future__ import annotations

from collections import deque

from cuzk_supervisor.core.logbudget import newest_fitting

Entry = tuple[int, str, int]
"""(sequence number, text, size in a body including its newline)."""


class LogBuffer:
    """Lines waiting to be pushed, per source, bounded in lines and bytes.

    Each line has a global sequence number, so "oldest" is across sources. Eviction looks at
    the head of each source's queue: O(number of sources), a handful.
    """

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._queues: dict[str, deque[Entry]] = {}
        self._source_bytes: dict[str, int] = {}
        self._skipped: dict[str, tuple[int, int]] = {}
        self._seq = 0
        self.lines = 0
        self.bytes = 0
        self.dropped_total = 0
        """Lines dropped past the buffer's bounds."""
        self.skipped_total = 0
        """Lines dropped past a turn's budget (older than the newest that fitted)."""

    def add(self, source: str, text: str, size: int) -> int:
        """Append one normalised line; return how many old lines were dropped to make room."""
        self._seq += 1
        queue = self._queues.get(source)
        if queue is None:
            queue = self._queues[source] = deque()
            self._source_bytes[source] = 0
        queue.append((self._seq, text, size))
        self._source_bytes[source] += size
        self.lines += 1
        self.bytes += size
        return self._evict()

    def source_lines(self, source: str) -> int:
        queue = self._queues.get(source)
        return len(queue) if queue is not None else 0

    def source_bytes(self, source: str) -> int:
        return self._source_bytes.get(source, 0)

    def waiting(self) -> dict[str, int]:
        """Sources with lines waiting or lines to summarise, and the sequence number of their
        oldest line (a source with only a count: after every line)."""
        out = {s: q[0][0] for s, q in self._queues.items()}
        for source in self._skipped:
            out.setdefault(source, self._seq + 1)
        return out

    def skipped(self, source: str) -> tuple[int, int]:
        """Lines (and their bytes) of ``source`` dropped and not yet summarised."""
        return self._skipped.get(source, (0, 0))

    def take_newest(self, source: str, room: int) -> list[Entry]:
        """Remove and return the newest lines of ``source`` that fit ``room`` bytes (oldest
        first); the older ones are dropped and counted as skipped."""
        queue = self._queues.get(source)
        if not queue:
            return []
        count = newest_fitting([entry[2] for entry in queue], room)
        taken = [queue.pop() for _ in range(count)][::-1]
        self._account(source, count, sum(entry[2] for entry in taken))
        older = self._queues.pop(source, deque())
        if older:
            size = sum(entry[2] for entry in older)
            self._account_gone(source, len(older), size)
            self._count(source, len(older), size)
            self.skipped_total += len(older)
        return taken

    def take_skipped(self, source: str) -> tuple[int, int]:
        """The count to summarise now (reset; :meth:`restore` puts it back)."""
        return self._skipped.pop(source, (0, 0))

    def restore(self, source: str, entries: list[Entry], skipped: tuple[int, int] = (0, 0)) -> int:
        """Put back what a push could not deliver: its lines at the front, its count; return
        the lines dropped to make room."""
        if skipped[0]:
            self._count(source, *skipped)
        if not entries:
            return 0
        queue = self._queues.get(source)
        if queue is None:
            queue = self._queues[source] = deque()
            self._source_bytes[source] = 0
        queue.extendleft(reversed(entries))
        size = sum(entry[2] for entry in entries)
        self._source_bytes[source] += size
        self.lines += len(entries)
        self.bytes += size
        return self._evict()

    def _evict(self) -> int:
        evicted = 0
        while self.lines > self.max_lines or self.bytes > self.max_bytes:
            source = min(self._queues, key=lambda s: self._queues[s][0][0])
            _, _, size = self._queues[source].popleft()
            self._account(source, 1, size)
            self._count(source, 1, size)
            evicted += 1
        self.dropped_total += evicted
        return evicted

    def _count(self, source: str, lines: int, size: int) -> None:
        old_lines, old_size = self._skipped.get(source, (0, 0))
        self._skipped[source] = (old_lines + lines, old_size + size)

    def _account(self, source: str, lines: int, size: int) -> None:
        self.lines -= lines
        self.bytes -= size
        self._source_bytes[source] -= size
        if not self._queues[source]:
            # Keep the dict small: a source with nothing waiting is forgotten.
            del self._queues[source]
            del self._source_bytes[source]

    def _account_gone(self, source: str, lines: int, size: int) -> None:
        """``lines`` of ``source`` already removed from its (popped) queue."""
        self.lines -= lines
        self.bytes -= size
        self._source_bytes.pop(source, None)
