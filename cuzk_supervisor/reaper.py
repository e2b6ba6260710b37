"""Reap exited children nobody else waits for, without stealing anyone's status (PID-1 duty).

asyncio waits for each child it started by that child's pid (3.11's ThreadedChildWatcher:
``waitpid(pid, 0)`` in a thread per child; from 3.12 PidfdChildWatcher), which is what this module
relies on; we install no watcher of our own (that API is deprecated in 3.12 and gone in 3.14). The
Reaper, in turn, never calls ``waitpid(-1)``: it peeks with ``waitid(P_ALL, WNOWAIT)`` (which does
not consume the status) and reaps only pids nobody has claimed (``Reaper.spawn``, or
``Reaper.holding`` + ``Reaper.own``). A child started any other way (a bare ``subprocess.run``)
can lose its status to the Reaper, and subprocess then reports 0: every spawner in the process
goes through one of those two doors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from cuzk_supervisor.daemon.childenv import child_environ

log = structlog.get_logger("supervisor.pid1")


@dataclass(frozen=True)
class Reaped:
    """A child the Reaper collected; ``returncode`` as subprocess reports it (-N: signal N)."""

    pid: int
    returncode: int


class Reaper:
    """Reaps exited children nobody else waits for, on SIGCHLD, without stealing anyone's status.

    Use from the event loop's thread: ``start()`` in the running loop, then start children that
    someone will wait for with ``await reaper.spawn(...)``, or ``with reaper.holding(): ...``
    around any other spawn followed by ``reaper.own(pid)`` before the block ends. The holding
    block may be entered from another thread (e.g. around ``subprocess.Popen`` in
    ``asyncio.to_thread``). Claimed pids are forgotten once their waiter has collected them.
    """

    def __init__(self, keep: int = 256) -> None:
        self.reaped: collections.deque[Reaped] = collections.deque(maxlen=keep)  # latest, for logs
        self._owned: set[int] = set()
        # holding() and own() may be used from another thread; a reaping pass runs under the lock,
        # so no spawn can begin in the middle of one. Passes are short: no call in them blocks.
        self._lock = threading.RLock()
        self._holds = 0
        self._pending = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Handle SIGCHLD in the running loop; collect what exited before we started."""
        _check_child_watcher()
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def own(self, pid: int) -> None:
        """Leave ``pid`` to the code that started it and will wait for it."""
        with self._lock:
            self._owned.add(pid)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Defer reaping while a child is spawned and claimed (it may exit before ``own``)."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                catch_up = self._holds == 0 and self._pending
                if catch_up:
                    self._pending = False
            if catch_up and self._loop is not None:
                self._loop.call_soon_threadsafe(self.reap)

    async def spawn(self, program: str, *args: str, **kwargs: Any) -> asyncio.subprocess.Process:
        """``asyncio.create_subprocess_exec`` with the child claimed for its ``wait()``; the
        child's environment (given or inherited) has the supervisor's secrets removed."""
        kwargs["env"] = child_environ(base=kwargs.get("env"))
        with self.holding():
            proc = await asyncio.create_subprocess_exec(program, *args, **kwargs)
            self.own(proc.pid)
        return proc

    def reap(self) -> list[Reaped]:
        """Collect every exited child that is not claimed; returns what it collected."""
        with self._lock:
            if self._holds:
                self._pending = True
                return []
            return self._pass()

    def _pass(self) -> list[Reaped]:
        # Claimed pids whose waiter has collected them are forgotten.
        self._owned = {pid for pid in self._owned if _is_our_child(pid)}
        done: list[Reaped] = []
        while True:
            try:
                ready = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break  # no children at all
            if ready is None:
                break  # none has exited
            if ready.si_pid in self._owned:
                # Its waiter collects it; until then it is all P_ALL shows, so look at the others
                # one pid at a time.
                done += [r for pid in _child_pids() if (r := self._reap_unowned(pid))]
                break
            got = self._reap_unowned(ready.si_pid)
            if got is not None:
                done.append(got)
            elif _is_our_child(ready.si_pid):
                break  # peeked as exited yet not collectable: never spin on it
        return done

    def _reap_unowned(self, pid: int) -> Reaped | None:
        if pid in self._owned:
            return None
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None  # collected by someone else meanwhile
        if got == 0:
            return None  # still running
        reaped = Reaped(pid, os.waitstatus_to_exitcode(status))
        self.reaped.append(reaped)
        log.info("pid1.orphan_reaped", pid=pid, returncode=reaped.returncode)
        return reaped


def _is_our_child(pid: int) -> bool:
    """Whether ``pid`` is still our child (running or not yet collected); consumes nothing."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _child_pids() -> list[int]:
    """Our children's pids, exited ones included (each thread has its own list)."""
    files = list(Path("/proc/self/task").glob("*/children"))
    if not files:  # kernel built without CONFIG_PROC_CHILDREN
        return [child.pid for child in psutil.Process().children()]
    pids: list[int] = []
    for path in files:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            pids += [int(pid) for pid in path.read_text().split()]
    return pids


def _check_child_watcher() -> None:
    # A watcher that calls waitpid(-1) (Safe/Fast) or owns SIGCHLD (MultiLoop) would fight us.
    if sys.version_info >= (3, 12):
        return  # asyncio always waits per pid from 3.12 on (pidfd, else a thread)
    watcher = asyncio.get_child_watcher()
    if not isinstance(watcher, asyncio.ThreadedChildWatcher | asyncio.PidfdChildWatcher):
        raise RuntimeError(
            f"the Reaper needs a child watcher that waits per pid, not {type(watcher).__name__}"
        )
