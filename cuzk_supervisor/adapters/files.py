"""Every file and folder the supervisor creates, with the modes we choose, safe from planted links.

One place for the rules (issue 13, item 6), used by the state file, the rendered daemon config,
the daemon log and the pidfiles:

- Folders are created ``0750`` and files ``0640`` (the state file ``0600``) whatever the umask:
  the mode is set with ``chmod``/``fchmod`` after creation, which the umask does not narrow.
- A temp file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name in the
  target's folder, so nothing planted at a temp path is opened; ``os.replace`` then puts it in
  place (it swaps a planted link at the target itself, never writes through it).
- Opening a file never blocks and never follows a link planted in our folders: ``O_NONBLOCK``
  (a FIFO where a file should be would otherwise hang the open) and a check with ``fstat`` that
  it is a regular file (:class:`NotARegularFile` when it is not).
- A folder others can write to is not ours to keep secrets in: :func:`ensure_private_folder`
  takes the world-write bit away or refuses.

The functions raise :class:`OSError` (with ``errno`` and the path); callers turn it into their
own one-line error (:class:`WriteError` here, ``StateWriteError`` for the state file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o750
FILE_MODE = 0o640
PRIVATE_MODE = 0o600
"""The state file: the manager's uuid and the reports waiting for it are nobody else's."""

CHILD_UMASK = 0o027
"""The umask of the children whose files are ours (the daemon's socket, the fetched params)."""

_TEMP_ATTEMPTS = 16


class NotARegularFile(OSError):
    """A FIFO, a device, a folder or a link where a regular file should be."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file (a {kind})", str(path))


class WriteError(Exception):
    """A file the supervisor needs could not be written or opened; one line: what, path, why.
    ``error`` (the :class:`OSError`) is kept for callers that decide by errno."""

    def __init__(self, what: str, path: Path | str, error: OSError) -> None:
        self.what = what
        self.path = Path(path)
        self.error = error
        super().__init__(f"cannot write {what} {path}: {describe(error)}")


def describe(error: OSError) -> str:
    """``[Errno 28] No space left on device``, without the path (the caller names it)."""
    if isinstance(error, NotARegularFile):
        return str(error.strerror)  # "not a regular file (a FIFO)": no errno of its own
    if error.errno and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "folder"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "special file"


# --- folders -----------------------------------------------------------------------------------


def make_folder(path: Path | str, mode: int = DIR_MODE) -> Path:
    """Create ``path`` and any missing parents, each with ``mode`` whatever the umask. Folders
    that exist keep their mode (they may be the operator's); a file there: NotADirectoryError."""
    folder = Path(path)
    missing: list[Path] = []
    probe = folder
    while not probe.is_dir():
        if probe.exists() or probe.is_symlink():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for created in reversed(missing):
        try:
            os.mkdir(created, mode)
        except FileExistsError:
            if not created.is_dir():
                raise
            continue  # made by someone else meanwhile: theirs, keep its mode
        os.chmod(created, mode)
    return folder


def world_writable(path: Path | str) -> bool:
    return bool(os.stat(path).st_mode & stat.S_IWOTH)


def ensure_private_folder(path: Path | str) -> bool:
    """Make sure an existing folder is not world-writable (anyone could plant links in it);
    True when its mode had to be fixed. Raises ``PermissionError`` (not our folder) when the
    ``chmod`` cannot do it, for the caller to refuse to start."""
    mode = os.stat(path).st_mode
    if not mode & stat.S_IWOTH:
        return False
    os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_IWOTH | stat.S_IWGRP))
    if world_writable(path):  # e.g. a filesystem that ignores chmod
        raise PermissionError(errno.EPERM, "still world-writable after chmod", str(path))
    return True


def fsync_folder(path: Path | str, fsync: Callable[[int], None] = os.fsync) -> None:
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileOps:
    """The OS calls an atomic write makes, injectable so tests can fail each one (disk full, a
    crash before the rename) without patching ``os``."""

    write: Callable[[int, bytes], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    replace: Callable[[str, str], None] = os.replace


def create_temp(folder: Path, name: str, mode: int = FILE_MODE) -> tuple[int, Path]:
    """A new, empty temp file beside ``folder / name``: ``(fd, path)``; nothing planted is used."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_ATTEMPTS):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:
            continue  # a planted file or link at that name: never ours, pick another
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temp file name", str(folder / f".{name}.*.tmp"))


def atomic_write(
    path: Path | str, data: bytes, mode: int = FILE_MODE, ops: FileOps | None = None
) -> None:
    """Write ``data`` to ``path`` atomically and durably with ``mode``: a temp file in the
    (created) folder is written, fsynced and renamed over ``path``, then the folder is fsynced
    so the rename survives a power cut. On error the temp file is removed, ``path`` untouched."""
    ops = ops if ops is not None else FileOps()
    target = Path(path)
    folder = make_folder(target.parent)
    fd, tmp = create_temp(folder, target.name, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = ops.write(fd, bytes(view))
                view = view[written:]
            ops.fsync(fd)
        finally:
            os.close(fd)
        ops.replace(str(tmp), str(target))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(folder, ops.fsync)


def open_append(path: Path | str, mode: int = FILE_MODE) -> BinaryIO:
    """Open (or create with ``mode``) a regular file for appending (:func:`open_regular`)."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND, mode), "ab")


def open_regular(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """Open (or create with ``mode``) a regular file with ``flags`` (``O_WRONLY | O_APPEND``,
    ``O_RDWR``); never blocks, never follows a symlink at ``path``. A file we find with a wider
    mode (an older run, another umask) is narrowed to ``mode``. Returns the fd (blocking)."""
    flags |= os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with contextlib.suppress(FileNotFoundError):
        found = os.lstat(path).st_mode
        if not stat.S_ISREG(found):
            raise NotARegularFile(path, _kind(found))
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(path, "symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, made since the lstat
            raise NotARegularFile(path, "FIFO") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, _kind(info.st_mode))
        if stat.S_IMODE(info.st_mode) & ~mode:
            with contextlib.suppress(OSError):
                os.fchmod(fd, stat.S_IMODE(info.st_mode) & mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd
    except BaseException:
        os.close(fd)
        raise


# --- reading -----------------------------------------------------------------------------------


def read_regular(path: Path | str, max_bytes: int | None = None) -> bytes:
    """The contents of a regular file; a FIFO or device raises :class:`NotARegularFile` at once
    (opened with ``O_NONBLOCK``, so a FIFO without a writer cannot hang us). A symlink to a
    regular file is followed (the operator's own). ``max_bytes``: refuse anything larger."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, _kind(info.st_mode))
        if max_bytes is not None and info.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
