"""Reading the kernel's small text files: one unbuffered read that answers None when the file
is absent or unreadable, and the parsers of the two shapes these files come in (one number;
``key value`` lines). Used by the memory samplers (cgroup, PSI, process tree).
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def read_text(path: str | os.PathLike[str]) -> str | None:
    """A small kernel file, or None when absent or unreadable. Unbuffered binary read: cheaper
    than ``Path.read_text`` and these files are a few KiB at most."""
    try:
        with open(path, "rb", buffering=0) as f:
            return os.fsdecode(f.read())  # as the kernel wrote it (paths may not be ASCII)
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None


def parse_keyed(text: str | None, keys: Iterable[str] | None = None) -> dict[str, int]:
    """``key value`` lines (``memory.stat``, ``memory.events``, ``memory.oom_control``) to a
    dict, keeping only ``keys`` when given; lines that do not parse are skipped."""
    if text is None:
        return {}
    wanted = None if keys is None else set(keys)
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if wanted is not None and name not in wanted:
            continue
        number = parse_int(value)
        if number is not None:
            out[name] = number
    return out
