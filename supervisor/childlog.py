"""Carry a child process's output: read without ever blocking it, strip ANSI, keep every line.

Every line goes to a bounded rotating file, whole. Structured log events are emitted per line up
to a rate budget; above it (a daemon flooding stdout) lines are counted and summarised instead, so
a flood can neither block the child on a full pipe nor turn the supervisor into a log formatter.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import structlog

# CSI sequences (colours, cursor moves) and OSC sequences (titles, hyperlinks).
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_READ_CHUNK = 256 * 1024


def strip_ansi(data: bytes) -> bytes:
    return _ANSI.sub(b"", data)


class RotatingLineFile:
    """Append-only text file of whole lines, rotated to ``.1`` … ``.N`` past ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        if max_bytes < 1024 or backups < 0:
            raise ValueError("log file needs max_bytes >= 1024 and backups >= 0")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self._size = self._handle.tell()

    def write_lines(self, lines: list[bytes]) -> None:
        """Write complete lines (each ending in ``\\n``); rotate only between lines."""
        batch: list[bytes] = []
        batch_size = 0
        for line in lines:
            if self._size + batch_size + len(line) > self.max_bytes and self._size + batch_size:
                self._handle.write(b"".join(batch))
                batch, batch_size = [], 0
                self._rotate()
            batch.append(line)
            batch_size += len(line)
        self._handle.write(b"".join(batch))
        self._size += batch_size
        self._handle.flush()

    def _rotate(self) -> None:
        self._handle.close()
        if self.backups:
            for index in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._handle = open(self.path, "ab")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        self._handle.close()


class LineRateBudget:
    """Token bucket for structured events: ``per_second`` sustained, ``burst`` at once."""

    def __init__(self, per_second: float, burst: int, clock: Callable[[], float]) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class OutputPump:
    """Pumps one or more child streams into the log file and structured events."""

    def __init__(
        self,
        source: str,
        log_file: RotatingLineFile | None,
        events_per_second: float = 500.0,
        tail_lines: int = 50,
        max_line_bytes: int = 64 * 1024,
    ) -> None:
        self.source = source
        self.log_file = log_file
        self.budget = LineRateBudget(events_per_second, int(events_per_second), time.monotonic)
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.max_line_bytes = max_line_bytes
        self.lines_total = 0
        self.lines_suppressed = 0
        self._log = structlog.get_logger().bind(source=source)
        self._listeners: list[Callable[[str], None]] = []

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with every line (ANSI stripped); must be cheap and never raise."""
        self._listeners.append(listener)

    async def pump(self, stream: asyncio.StreamReader, stream_name: str) -> None:
        """Read until EOF in large chunks; a partial last line is kept until its newline."""
        pending = b""
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                break
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            pending = data[cut:]
            if cut:
                self._emit(strip_ansi(data[:cut]).splitlines(keepends=True), stream_name)
            if len(pending) > self.max_line_bytes:
                # An endless line: flush it as one line rather than grow without bound.
                self._emit([strip_ansi(pending) + b"\n"], stream_name)
                pending = b""
        if pending:
            self._emit([strip_ansi(pending) + b"\n"], stream_name)
        self._report_suppressed()

    def _emit(self, clean: list[bytes], stream_name: str) -> None:
        if self.log_file is not None:
            self.log_file.write_lines(clean)
        for line in clean:
            text = line.rstrip(b"\r\n").decode("utf-8", "replace")
            self.lines_total += 1
            self.tail.append(text)
            for listener in self._listeners:
                listener(text)
            if self.budget.take():
                self._report_suppressed()
                self._log.info(text, stream=stream_name)
            else:
                self.lines_suppressed += 1

    def _report_suppressed(self) -> None:
        if self.lines_suppressed:
            self._log.warning(
                "child.output_suppressed",
                lines=self.lines_suppressed,
                detail="output rate above the event budget; every line is in the log file",
                log_file=str(self.log_file.path) if self.log_file else None,
            )
            self.lines_suppressed = 0
