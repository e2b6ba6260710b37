"""Reading an operator's input file (settings file, daemon base config, C1 input) safely.

The size is taken with ``fstat`` before anything is read, so a huge (or sparse) file is refused
at once; a FIFO, a device or a folder is refused without blocking (the file is opened with
``O_NONBLOCK``); text is decoded as UTF-8. Every problem is a one-line ``UsageError`` naming the
file and what it is for.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from cuzk_supervisor.errors import UsageError


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def read_bytes(path: Path, *, what: str, max_bytes: int, limit_why: str = "") -> bytes:
    """The whole file, at most ``max_bytes``; UsageError ``cannot read WHAT PATH: …`` otherwise.
    ``limit_why`` says where the limit comes from, in the error."""
    why = f" ({limit_why})" if limit_why else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL byte
        raise UsageError(f"cannot read {what} {path!r}: {exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UsageError(f"cannot read {what} {path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise UsageError(
                f"{what} {path} is {_size_text(info.st_size)}, over the limit of "
                f"{_size_text(max_bytes)}{why}"
            )
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # grew between the stat and the read
        raise UsageError(f"{what} {path} is over the limit of {_size_text(max_bytes)}{why}")
    return data


def read_text(path: Path, *, what: str, max_bytes: int) -> str:
    """``read_bytes`` decoded as UTF-8 (one-line UsageError when it is not)."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} {path} is not UTF-8 text (bad byte at offset {exc.start})"
        ) from None


def read_toml(path: Path, *, what: str, max_bytes: int) -> dict[str, Any]:
    """``path`` read as UTF-8 TOML; every way it can be wrong is one line naming ``what``."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise UsageError(f"{what} {path} is not valid TOML: nested too deep") from None
    except ValueError as exc:  # TOMLDecodeError, or e.g. an integer of more than 4300 digits
        raise UsageError(f"{what} {path} is not valid TOML: {exc}") from None
