"""Daemon-style log lines, as tracing-subscriber's default formatter prints them with ANSI on.

The real daemon colours its stdout even when it is a pipe or a file, and ignores ``NO_COLOR``;
so do we, on purpose: whoever reads our stdout (the supervisor) must strip the escapes.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import BinaryIO

LEVELS = ("error", "warn", "info", "debug", "trace")
_RANK = {name: i for i, name in enumerate(LEVELS)}
_ALIASES = {"warning": "warn", "err": "error", "off": "off"}
# tracing's colours: TRACE purple, DEBUG blue, INFO green, WARN yellow, ERROR red.
_COLOUR = {"trace": "35", "debug": "34", "info": "32", "warn": "33", "error": "31"}
DIM = "\x1b[2m"
ITALIC = "\x1b[3m"
RESET = "\x1b[0m"
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """The line without colour escapes (what a reader of our stdout must do)."""
    return ANSI_RE.sub("", text)


def normalise_level(text: str | None) -> str | None:
    """A level name as tracing knows it, or None if ``text`` is not one."""
    if not text:
        return None
    name = _ALIASES.get(text.strip().lower(), text.strip().lower())
    return name if name in _RANK or name == "off" else None


def level_from_rust_log(value: str | None) -> str | None:
    """The level ``RUST_LOG`` sets for the daemon: a ``cuzk*=level`` directive, else a bare one."""
    if not value:
        return None
    bare: str | None = None
    for directive in value.split(","):
        target, sep, level = directive.strip().rpartition("=")
        if not sep:
            bare = normalise_level(level) or bare
        elif target.startswith("cuzk"):
            found = normalise_level(level)
            if found:
                return found
    return bare


def timestamp(now: dt.datetime | None = None) -> str:
    moment = now or dt.datetime.now(dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _value(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


def format_line(level: str, target: str, message: str, fields: dict[str, object], ts: str) -> str:
    """One coloured line, newline included."""
    parts = [
        f"{DIM}{ts}{RESET} \x1b[{_COLOUR[level]}m{level.upper():>5}{RESET} ",
        f"{DIM}{target}{RESET}{DIM}:{RESET} {message}",
    ]
    for key, value in fields.items():
        parts.append(f" {ITALIC}{key}{RESET}{DIM}={RESET}{_value(value)}")
    parts.append("\n")
    return "".join(parts)


class DaemonLog:
    """Writes daemon-style lines to a binary stream (stdout), one flush per line."""

    def __init__(self, level: str = "info", stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._max = -1 if level == "off" else _RANK[level]

    def enabled(self, level: str) -> bool:
        return _RANK[level] <= self._max

    def log(self, level: str, target: str, message: str, **fields: object) -> None:
        if self.enabled(level):
            self.write_raw(format_line(level, target, message, fields, timestamp()).encode())

    def write_raw(self, data: bytes) -> None:
        """Write pre-formatted bytes (the flood fault writes thousands of lines per call)."""
        try:
            self._stream.write(data)
            self._stream.flush()
        except BrokenPipeError:
            # The reader went away; the real daemon keeps running without its log, so do we.
            pass

    def error(self, target: str, message: str, **fields: object) -> None:
        self.log("error", target, message, **fields)

    def warn(self, target: str, message: str, **fields: object) -> None:
        self.log("warn", target, message, **fields)

    def info(self, target: str, message: str, **fields: object) -> None:
        self.log("info", target, message, **fields)

    def debug(self, target: str, message: str, **fields: object) -> None:
        self.log("debug", target, message, **fields)
