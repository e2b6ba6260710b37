"""The log shipper's buffer: lines waiting to be sent, per source, bounded in lines and bytes.
The line bound is what the manager keeps of an instance (10,000 lines): a backlog past it would
be thrown away on arrival. Past either bound the OLDEST lines (across sources) are dropped and
counted, and
:func:`dropped_warning` is the line that later tells the manager how many. Pure: no I/O, no
clock, no lock (the shipper holds one around it).
"""

from __future__ import annotations

from collections import deque

Entry = tuple[int, str, int]
"""(sequence number, text, size in a body including its newline)."""


def dropped_warning(count: int) -> str:
    """The one line that tells the manager how many of the oldest lines were dropped."""
    return (
        f"dropped the {count} oldest log lines: more were waiting to be sent than the manager "
        "keeps for an instance"
    )


class LogBuffer:
    """Lines waiting to be sent, per source, bounded in lines and bytes; drops the oldest.

    Each line has a global sequence number, so "oldest" is across sources. Eviction looks at
    the head of each source's queue: O(number of sources), a handful.
    """

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._queues: dict[str, deque[Entry]] = {}
        self._source_bytes: dict[str, int] = {}
        self._seq = 0
        self.lines = 0
        self.bytes = 0
        self.dropped = 0
        """Lines dropped and not yet reported to the manager."""
        self.dropped_total = 0

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

    def sources_by_age(self) -> list[str]:
        """Sources with lines waiting, the one holding the oldest line first."""
        return [s for s, _ in sorted(self._queues.items(), key=lambda item: item[1][0][0])]

    def take(self, source: str, max_body_bytes: int, max_lines: int | None = None) -> list[Entry]:
        """Remove and return the oldest lines of ``source`` that fit one body (and, given,
        at most ``max_lines`` of them; one line at least)."""
        queue = self._queues.get(source)
        taken: list[Entry] = []
        size = 0
        while queue and (
            not taken
            or (size + queue[0][2] <= max_body_bytes
                and (max_lines is None or len(taken) < max_lines))
        ):  # fmt: skip
            entry = queue.popleft()
            taken.append(entry)
            size += entry[2]
        self._account(source, len(taken), size)
        return taken

    def restore(self, source: str, entries: list[Entry]) -> int:
        """Put back a batch that could not be sent, at the front; return lines dropped."""
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

    def acknowledge_dropped(self, count: int) -> None:
        self.dropped -= min(count, self.dropped)

    def _evict(self) -> int:
        evicted = 0
        while self.lines > self.max_lines or self.bytes > self.max_bytes:
            source = min(self._queues, key=lambda s: self._queues[s][0][0])
            _, _, size = self._queues[source].popleft()
            self._account(source, 1, size)
            evicted += 1
        self.dropped += evicted
        self.dropped_total += evicted
        return evicted

    def _account(self, source: str, lines: int, size: int) -> None:
        self.lines -= lines
        self.bytes -= size
        self._source_bytes[source] -= size
        if not self._queues[source]:
            # Keep the dict small: a source with nothing waiting is forgotten.
            del self._queues[source]
            del self._source_bytes[source]
