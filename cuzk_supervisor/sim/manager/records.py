"""In-memory records of the simulated manager: the instances' pushed log lines (as the real
manager keeps them: 10,000 per instance, the oldest 1,000 dropped at once when full, lost on
restart), the manager's own log (5,000 lines for the whole fleet, a ``[running] uuid=…`` line
per ``/running`` among them) and the journal of every request received (the sim's own, for
tests: what arrived, in which order, answered how)."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

LOG_PUSH_LIMIT = 256 * 1024  # bytes of a push body that are read; the rest is dropped
LOG_LINES_KEPT = 10_000  # per instance
MANAGER_LOG_KEPT = 5_000  # the manager's own log, shared by the whole fleet
MANAGER_LOG_SOURCE = "manager"
DEFAULT_LOG_SOURCE = "unknown"
ALL_SOURCES = "all"  # as a source filter: every source (as no filter)
DEFAULT_TAIL = 1_000  # lines an instance-logs query returns without a usable ``tail``
JOURNAL_KEPT = 200_000


def split_log_body(body: bytes, limit: int = LOG_PUSH_LIMIT) -> list[str]:
    """The lines of a push body as the manager stores them: the first ``limit`` bytes only
    (a line cut there is kept, cut), split on ``\\n`` only (a ``\\r`` before it stays in the
    text, and a line that is only ``\\r`` is kept), empty lines dropped; bytes that are not
    UTF-8 become U+FFFD (as Go's JSON encoder writes them)."""
    text = body[:limit].decode("utf-8", errors="replace")
    return [line for line in text.split("\n") if line]


def millis(ts: float) -> int:
    """Unix seconds as integer milliseconds (Go's ``time.Now().UnixMilli()``)."""
    return int(ts * 1000)


@dataclass(frozen=True, slots=True)
class LogLine:
    src: str
    text: str
    ts: float

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "text": self.text, "ts": millis(self.ts)}


class LogBuffer:
    """One bounded buffer of lines, as the real manager's: when a line makes it longer than
    ``keep``, the oldest tenth (at least one) is dropped at once."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.drop = max(1, keep // 10)
        self.lines: list[LogLine] = []

    def extend(self, new: Iterable[LogLine]) -> int:
        """Append; return how many of the oldest lines were dropped to make room."""
        # Appending line by line and dropping a tenth each time the buffer overflows leaves
        # the same lines as appending all and then dropping tenths while it is too long.
        self.lines.extend(new)
        excess = len(self.lines) - self.keep
        if excess <= 0:
            return 0
        dropped = -(-excess // self.drop) * self.drop
        del self.lines[:dropped]
        return dropped

    def query(self, source: str | None, tail: int) -> list[LogLine]:
        lines = self.lines
        if source and source != ALL_SOURCES:
            lines = [line for line in lines if line.src == source]
        return list(lines[-tail:]) if tail > 0 else list(lines)


class LogBook:
    """A :class:`LogBuffer` of ``keep`` lines per instance uuid, in arrival order."""

    def __init__(self, keep: int = LOG_LINES_KEPT) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._books: dict[str, LogBuffer] = {}
        self._received = 0
        self._dropped = 0

    def push(self, uuid: str, source: str, lines: Iterable[str], ts: float) -> int:
        new = [LogLine(source, text, ts) for text in lines]
        with self._lock:
            self._dropped += self._books.setdefault(uuid, LogBuffer(self._keep)).extend(new)
            self._received += len(new)
        return len(new)

    def totals(self) -> dict[str, int]:
        """Lines received (stored on arrival), dropped since (the oldest of a full buffer) and
        kept now, over every instance; and the number of instances with a buffer."""
        with self._lock:
            kept = sum(len(book.lines) for book in self._books.values())
            return {
                "instances": len(self._books),
                "lines_received": self._received,
                "lines_dropped": self._dropped,
                "lines_kept": kept,
            }

    def query(self, uuid: str, source: str | None = None, tail: int = 0) -> list[LogLine]:
        """Lines of ``uuid``: every source for None, ``""`` or ``"all"``, else only
        ``source``'s; the last ``tail`` if > 0, else all."""
        with self._lock:
            book = self._books.get(uuid)
            return book.query(source, tail) if book is not None else []

    def count(self, uuid: str) -> int:
        with self._lock:
            book = self._books.get(uuid)
            return len(book.lines) if book is not None else 0


def go_log_prefix(ts: float) -> str:
    """The date and time Go's standard logger puts before each line (UTC here)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y/%m/%d %H:%M:%S ")


class ManagerLog:
    """The manager's own log (what its ``log.Printf`` writes): ``keep`` lines for the whole
    fleet, source ``manager``, each text prefixed with the date and time as Go's logger does."""

    def __init__(self, keep: int = MANAGER_LOG_KEPT) -> None:
        self._lock = threading.Lock()
        self._buffer = LogBuffer(keep)
        self._written = 0
        self._running = 0

    def write(self, message: str, ts: float) -> None:
        line = LogLine(MANAGER_LOG_SOURCE, go_log_prefix(ts) + message, ts)
        with self._lock:
            self._buffer.extend([line])
            self._written += 1
            self._running += message.startswith("[running] ")

    def totals(self) -> dict[str, int]:
        """Lines written since start (``[running]`` ones among them) and kept now."""
        with self._lock:
            return {
                "lines_written": self._written,
                "running_lines": self._running,
                "lines_kept": len(self._buffer.lines),
                "keep": self._buffer.keep,
            }

    def lines(self, tail: int = 0) -> list[LogLine]:
        with self._lock:
            return self._buffer.query(None, tail)


@dataclass(slots=True)
class JournalEntry:
    """One request as received and answered (``GET /sim/requests`` lists these)."""

    seq: int  # order of arrival (assigned when the request line was read)
    ts: float  # receive time, unix seconds
    method: str
    path: str
    query: str
    status: int = 0
    faulted: bool = False  # answered by a fault switch
    fault: str | None = None  # its kind: error, html, bad_body, maintenance
    applied: bool = False  # the request reached the API (a fault answer: only bad_body_applied)
    sim: bool = False  # a /sim/ control request
    body_bytes: int = 0  # request body size as received (before any cut)
    log_source: str | None = None  # X-Log-Source as sent (None: header absent)
    instance_uuid: str | None = None  # X-Instance-UUID as sent
    json: Any = None  # the request body, parsed, for the JSON endpoints
    lines_stored: int | None = None  # log pushes: lines kept after the cut and empty-line drop
    answered: bool = False  # the answer was written (False: the client was gone, or dropped)
    duration: float = 0.0  # seconds from receipt to the answer written

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RequestJournal:
    """Every request, bounded to the last ``keep``; listed in arrival order."""

    def __init__(self, keep: int = JOURNAL_KEPT) -> None:
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._entries: deque[JournalEntry] = deque(maxlen=keep)

    def next_seq(self) -> int:
        with self._lock:
            return next(self._seq)

    def record(self, entry: JournalEntry) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(
        self, *, since: int = 0, path: str | None = None, include_sim: bool = False
    ) -> list[JournalEntry]:
        with self._lock:
            entries = list(self._entries)
        entries.sort(key=lambda e: e.seq)
        return [
            e
            for e in entries
            if e.seq > since and (include_sim or not e.sim) and (path is None or e.path == path)
        ]
