"""One writer on the parameter files by construction: the fetch runs under a lock the kernel
releases with its last holder (issue 46).

The lock is an exclusive ``flock`` on ``.cuzk-supervisor-fetch.lock`` in the params folder. A
flock belongs to an open file description, not to a process: the supervisor takes it, hands the
descriptor to the fetch (``pass_fds``), and everything the fetch starts inherits it, a grandchild
that escaped with ``setsid`` too. While any process of a fetch holds it, no second fetch takes
the lock, whatever became of the supervisor that started the first; the kernel releases it with
its last holder. No mark that can fail (a pidfile written too late, an environment not yet
visible, a zombie taken for a live supervisor) decides whether two fetches write at once: the
marks only find what to stop.

Who holds it: ``/proc/locks`` names the pid that took the flock (the taker, a supervisor), and
``/proc/PID/fdinfo`` shows it on every descriptor that holds it (the holders). Then
``core.fetchlock`` decides: holders nobody else will stop (a dead supervisor's fetch, or ours
once our fetch has ended) are stopped at once, with the leftovers their marks find; a live
supervisor's fetch is waited for, with one line saying why and for whom, at most
``params_lock_wait_s``; past that, :class:`LockUnavailable` (exit 8, the reason reported).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog

from cuzk_supervisor import killtree
from cuzk_supervisor.adapters import files
from cuzk_supervisor.core import fetchlock
from cuzk_supervisor.core.fetchlock import Turn
from cuzk_supervisor.daemon import leftovers

log = structlog.get_logger()

LOCK_NAME = ".cuzk-supervisor-fetch.lock"
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5
"""Nothing tells a waiter that a flock was released (no event, no inotify): it tries again,
at first soon (a holder just stopped), then every half second."""


class LockUnavailable(Exception):
    """The lock could not be taken: still held past the wait, or the file cannot be opened."""


@dataclass(frozen=True, slots=True)
class Held:
    """The lock held by someone else: the pid that took it (None: not visible from here, in
    another pid namespace) and the file, to find the processes holding it by."""

    locker: int | None
    dev: int
    ino: int


def lock_path(folder: Path) -> Path:
    return folder / LOCK_NAME


def _open(path: Path) -> int:
    """The lock file, ``0600`` whatever the umask; never through a planted link (symbolic: refused
    by ``files.open_regular``; hard: a second name for it is refused here)."""
    fd = files.open_regular(path, os.O_RDWR, files.PRIVATE_MODE)
    try:
        info = os.fstat(fd)
        if info.st_nlink != 1:
            raise OSError(errno.EMLINK, f"{info.st_nlink} names for it (a planted link?)", path)
        if stat.S_IMODE(info.st_mode) != files.PRIVATE_MODE:
            os.fchmod(fd, files.PRIVATE_MODE)
        return fd
    except BaseException:
        os.close(fd)
        raise


def attempt(path: Path, proc: Path = Path("/proc")) -> int | Held:
    """Take the lock on a description of our own (its fd), or say who took it. Blocking: from
    async code through a thread."""
    looks = 0
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                info = os.fstat(fd)
            finally:
                os.close(fd)
            locker = taker(info.st_dev, info.st_ino, proc)
            if locker is None:  # no line: a filesystem that names it otherwise, or released
                lockers = set(_scan(info.st_dev, info.st_ino, proc).values())
                looks += 1
                if len(lockers) != 1 and looks < 3:
                    continue  # released, or taken again, while we looked: try again
                locker = lockers.pop() if len(lockers) == 1 else 0
            return Held(locker or None, info.st_dev, info.st_ino)  # 0: not visible from here
        except BaseException:
            os.close(fd)
            raise
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        here = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (here.st_dev, here.st_ino):
            return fd
        os.close(fd)  # removed or replaced since our open: the lock of a file nobody opens


def taker(dev: int, ino: int, proc: Path = Path("/proc")) -> int | None:
    """The pid that took the flock of file ``dev``/``ino`` (``/proc/locks``: ``1: FLOCK  ADVISORY
    WRITE PID MAJ:MIN:INO 0 EOF``; 0 when not visible from here); None: no such line (released,
    or a filesystem whose locks name the file otherwise than ``stat``: overlayfs, btrfs)."""
    file = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    with open(proc / "locks") as locks:
        for line in locks:
            fields = line.split()
            if fields[1:2] == ["FLOCK"] and fields[5:6] == [file]:
                return int(fields[4])
    return None


def holders(held: Held, proc: Path = Path("/proc")) -> list[int]:
    """The processes (but us) holding ``held``'s lock (not a lock taken again meanwhile)."""
    return sorted(pid for pid, locker in _scan(held.dev, held.ino, proc).items()
                  if locker == (held.locker or 0))  # fmt: skip


def _scan(dev: int, ino: int, proc: Path) -> dict[int, int]:
    """Each process (but us) with a descriptor of file ``dev``/``ino`` that holds its flock, and
    the pid that took it (the ``fdinfo`` lock line). Every descriptor of every process is looked
    at: marks find the usual holders faster (``leftovers``)."""
    me = os.getpid()
    found: dict[int, int] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to look at
            for fd in os.listdir(f"{entry.path}/fd"):
                with contextlib.suppress(OSError, ValueError):
                    info = os.stat(f"{entry.path}/fd/{fd}")
                    if (info.st_dev, info.st_ino) != (dev, ino):
                        continue
                    locker = _locker(f"{entry.path}/fdinfo/{fd}")
                    if locker is not None:
                        found[int(entry.name)] = locker
                        break
    return found


def _locker(fdinfo: str) -> int | None:
    """The pid in the descriptor's flock line (``lock:\t1: FLOCK  ADVISORY  WRITE PID ...``)."""
    with open(fdinfo) as info:
        for line in info:
            fields = line.split()
            if fields[:1] == ["lock:"] and fields[2:3] == ["FLOCK"]:
                return int(fields[5])
    return None


def _stale(held: Held, role: str, pidfile: Path | None) -> list[int]:
    """What to stop for a lock nobody else will free: the fetch's leftovers by their marks (a
    quick look, and they find a fetch that dropped the descriptor too); when there are none,
    every holder of the lock (a scan: a holder that cleared its environment, our own fetch's)."""
    stale = [pid for pid in leftovers.find(role, pidfile) if _running(pid)]
    return stale or [pid for pid in holders(held) if _running(pid)]


def _running(pid: int) -> bool:
    """Still running: a zombie is not (its descriptors are closed, its children orphans)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.asynccontextmanager
async def held(
    folder: Path,
    *,
    role: str,
    pidfile: Path | None,
    wait_s: float,
    grace_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[int]:
    """The lock, taken (see the module's doc) and released at the end of the block; its fd is
    for ``pass_fds`` (the descriptor is close-on-exec: no other child gets it)."""
    fd = await _acquire(lock_path(folder), role, pidfile, wait_s, grace_s, clock)
    try:
        yield fd
    finally:
        os.close(fd)


async def _acquire(
    path: Path,
    role: str,
    pidfile: Path | None,
    wait_s: float,
    grace_s: float,
    clock: Callable[[], float],
) -> int:
    started: float | None = None  # when it was first found held
    said: tuple[fetchlock.Holder, int | None] | None = None  # one line per holder
    pause = POLL_FIRST_S
    looked_again = False
    stopped: list[int] = []
    while True:
        try:
            got = await asyncio.to_thread(attempt, path)
        except OSError as exc:
            why = files.describe(exc)
            raise LockUnavailable(f"cannot open the params lock {path}: {why}") from None
        if isinstance(got, int):
            if started is not None and said is not None:
                log.info("params.lock_taken", lock=str(path), waited_s=round(clock() - started, 1))
            return got
        alive = got.locker is not None and _running(got.locker)
        who = fetchlock.holder(got.locker, os.getpid(), alive)
        reason = fetchlock.why(who, got.locker)
        started = clock() if started is None else started
        step = fetchlock.turn(who, clock() - started, wait_s)
        if step is Turn.GIVE_UP:
            pids = ", ".join(map(str, await asyncio.to_thread(holders, got))) or "not visible here"
            raise LockUnavailable(
                f"{reason}: the params lock {path} is still held after {wait_s:g} s (pids "
                f"{pids}); not fetching beside it"
            )
        if step is Turn.STOP:
            stale = await asyncio.to_thread(_stale, got, role, pidfile)
            if stale:
                if stale != stopped:  # again (stuck in the kernel?): said once
                    log.warning("params.lock_holders_stopped", reason=reason, pids=stale)
                stopped = stale
                await asyncio.to_thread(killtree.kill_tree, stale, grace_s)
                pause = POLL_FIRST_S
                continue
            if not looked_again:  # its holders exited while we looked: the lock is free now?
                looked_again = True
                await asyncio.sleep(POLL_FIRST_S)
                continue
        if said != (who, got.locker):  # waiting (or its holders not visible from here)
            said = (who, got.locker)
            log.warning("params.lock_wait", reason=reason, pid=got.locker, wait_s=wait_s,
                        lock=str(path))  # fmt: skip
        await asyncio.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)
