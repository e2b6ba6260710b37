"""File-system faults for tests: a tiny tmpfs that is full, made and unmounted by the test."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def full_tmpfs(folder: Path, size: str = "64k") -> Iterator[Path]:
    """Mount a ``size`` tmpfs at ``folder`` (created), fill it, yield it; always unmounted.

    Skips the test where mounting is impossible (not root, no CAP_SYS_ADMIN): a disk-full test
    without a real full disk would test nothing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        check=False,
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        fill(folder)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def fill(folder: Path) -> None:
    """Write until the file system says it is full."""
    with contextlib.suppress(OSError), (folder / "filler").open("wb") as filler:
        filler.write(b"\0" * (1 << 20))


def make_room(folder: Path) -> None:
    (folder / "filler").unlink()


def bytes_read() -> int:
    """Bytes this process has read so far through read(2) and the like (``rchar`` in
    /proc/self/io, every thread counted): a test that a file is refused by its size, not read,
    checks this count, not how long the refusal took."""
    for line in Path("/proc/self/io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "rchar":
            return int(value)
    raise RuntimeError("no rchar in /proc/self/io")
