"""In-memory records of the simulated manager: the instances' pushed log lines (as the real
manager keeps them: the last 10,000 per instance, lost on restart) and the journal of every
request received (the sim's own, for tests: what arrived, in which order, answered how)."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from supervisor.sim.manager_store import rfc3339

LOG_PUSH_LIMIT = 256 * 1024  # bytes of a push body that are read; the rest is dropped
LOG_LINES_KEPT = 10_000  # per instance
DEFAULT_LOG_SOURCE = "unknown"
JOURNAL_KEPT = 200_000


def split_log_body(body: bytes, limit: int = LOG_PUSH_LIMIT) -> list[str]:
    """The lines of a push body as the manager stores them: the first ``limit`` bytes only
    (a line cut there is kept, cut), split on ``\\n``, a trailing ``\\r`` removed, empty lines
    dropped; bytes that are not UTF-8 become U+FFFD."""
    text = body[:limit].decode("utf-8", errors="replace")
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return [line for line in lines if line]


@dataclass(frozen=True, slots=True)
class LogLine:
    src: str
    text: str
    ts: float

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "text": self.text, "ts": rfc3339(self.ts)}


class LogBook:
    """The last ``keep`` lines per instance uuid, in arrival order."""

    def __init__(self, keep: int = LOG_LINES_KEPT) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._lines: dict[str, deque[LogLine]] = {}

    def push(self, uuid: str, source: str, lines: Iterable[str], ts: float) -> int:
        new = [LogLine(source, text, ts) for text in lines]
        with self._lock:
            book = self._lines.setdefault(uuid, deque(maxlen=self._keep))
            book.extend(new)
        return len(new)

    def query(self, uuid: str, source: str | None = None, tail: int | None = None) -> list[LogLine]:
        """Lines of ``uuid`` (only ``source``'s if given); the last ``tail`` if > 0."""
        with self._lock:
            lines = list(self._lines.get(uuid, ()))
        if source:
            lines = [line for line in lines if line.src == source]
        if tail is not None and tail > 0:
            lines = lines[-tail:]
        return lines


@dataclass(slots=True)
class JournalEntry:
    """One request as received and answered (``GET /sim/requests`` lists these)."""

    seq: int  # order of arrival (assigned when the request line was read)
    ts: float  # receive time, unix seconds
    method: str
    path: str
    query: str
    status: int = 0
    faulted: bool = False  # answered by a fault switch; never applied
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
