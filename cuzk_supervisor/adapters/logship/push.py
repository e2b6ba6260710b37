"""The log-push wire format (pure): how lines become ``POST /api/log-push`` bodies.

The manager reads only the first 256 KiB of a body and splits it on newlines
(docs/manager-api.md): lines are normalised and packed so that nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_BODY_BYTES", "clean_source", "encode_body", "normalize_line", "split_bodies"]

MAX_BODY_BYTES = 256 * 1024
"""The manager reads only the first 256 KiB of a log-push body and silently drops the rest."""
TRUNCATED_MARK = " …[truncated {n} bytes]"


def normalize_line(line: str, max_bytes: int = MAX_BODY_BYTES - 1) -> tuple[str, int]:
    """One log line as the manager will store it, and its size in a body (newline included).
    Trailing line breaks go; inner ones become a visible ``\\n`` (the manager splits bodies on
    newlines). A line over ``max_bytes`` UTF-8 bytes is cut on a character boundary and ends with
    a marker saying how much was cut. An empty line stays empty (the manager drops those)."""
    text = line.rstrip("\r\n")
    if "\n" in text or "\r" in text:
        text = text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text, len(data) + 1 if data else 0
    # Marker length depends on the number it shows; use the widest it can need.
    mark_room = len(TRUNCATED_MARK.format(n=len(data)).encode())
    keep = max(max_bytes - mark_room, 0)
    head = data[:keep].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode())
    text = head + TRUNCATED_MARK.format(n=cut)
    return text, len(text.encode()) + 1


def encode_body(lines: Iterable[str]) -> bytes:
    """A log-push body: lines joined with ``\\n``, one after the last."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "replace")


def split_bodies(lines: Iterable[str], max_body_bytes: int = MAX_BODY_BYTES) -> list[list[str]]:
    """Normalise ``lines`` and pack them, in order, into groups whose body fits the limit."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for raw in lines:
        text, n = normalize_line(raw, max_body_bytes - 1)
        if not n:
            continue
        if current and size + n > max_body_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(text)
        size += n
    if current:
        groups.append(current)
    return groups


def clean_source(source: str) -> str:
    """A header-safe log source name (the manager shows unknown names under "all")."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in source)
    return cleaned[:64] or "unknown"
