"""Reading the kernel's small text files: one unbuffered read that answers None when the file
is absent or unreadable (:func:`read_text`), the same through a descriptor kept open for a file
read every second (:class:`KernelFile`), and the parsers of the two shapes these files come in
(one number; ``key value`` lines). Used by the memory samplers (cgroup, PSI, process tree).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable


def read_text(path: str | os.PathLike[str]) -> str | None:
    """A small kernel file, or None when absent or unreadable. Unbuffered binary read: cheaper
    than ``Path.read_text`` and these files are a few KiB at most."""
    try:
        with open(path, "rb", buffering=0) as f:
            return os.fsdecode(f.read())  # as the kernel wrote it (paths may not be ASCII)
    except OSError:
        return None


# More than any of these files holds (memory.stat: about 2 KiB); a longer one is read on.
_CHUNK = 65536


class KernelFile:
    """A kernel file read again and again (every memory sample): opened once, then read from
    its start with ``pread``, which makes the kernel render it afresh. An open and a close less
    per read: the sampler's files are most of the idle supervisor's system calls (issue 35).

    Only the kernel's own files (size 0: ``/proc``, cgroup and PSI files) are kept open. A
    regular file (a test's fixture, the simulator's cgroup-like folder, whose files it replaces
    by a rename) is opened anew at every read, or the descriptor would read the replaced file.
    ``read`` answers None as :func:`read_text`; after a failed read the descriptor is closed and
    the next read opens the path again (a cgroup removed and made again). ``O_CLOEXEC``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None

    def read(self) -> str | None:
        fd = self._fd
        if fd is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            data = _read_all(fd)
            if self._fd is None and os.fstat(fd).st_size == 0:
                self._fd = fd  # rendered by the kernel: kept
        except OSError:
            data = None
        if self._fd != fd or data is None:
            self._fd = None
            os.close(fd)
        return None if data is None else os.fsdecode(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def _read_all(fd: int) -> bytes:
    data = os.pread(fd, _CHUNK, 0)
    while data and len(data) % _CHUNK == 0:
        more = os.pread(fd, _CHUNK, len(data))
        if not more:
            break
        data += more
    return data


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
    out: dict[str, int] = {}
    if keys is not None:
        # Only the lines of those keys, found by one regular expression: a v1 memory.stat has
        # seventy lines, five of them wanted, read every memory sample.
        for name, value in _keyed_lines(tuple(keys)).findall(text):
            number = parse_int(value)
            if number is not None:
                out[name] = number
        return out
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        number = parse_int(value)
        if number is not None:
            out[name] = number
    return out


@functools.lru_cache(maxsize=32)
def _keyed_lines(keys: tuple[str, ...]) -> re.Pattern[str]:
    """The lines ``key value`` of these keys (the name up to the first space, as
    ``str.partition`` splits it)."""
    names = "|".join(re.escape(k) for k in keys)
    return re.compile(rf"^({names}) (.*)$", re.MULTILINE)
