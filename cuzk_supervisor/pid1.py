"""PID-1 duties: reap orphans, forward signals, become a child subreaper, clean up, exit codes.

Small and boring on purpose (tini is the model). The supervisor may run as the container's PID 1
or as a background process started by a platform hook (incidents I7); either way it reaps the
orphans its children leave, passes stop signals on, and leaves nothing it started running.

Reaping and asyncio's child watcher. asyncio waits for each child it started by that child's pid:
on Python 3.11 the default ThreadedChildWatcher runs ``waitpid(pid, 0)`` in a thread per child;
from 3.12 the default is PidfdChildWatcher (``waitpid(pid)`` once the pidfd is readable). Both only
ever wait on their own pids, which is what this module relies on; we install no watcher of our
own (that API is deprecated in 3.12 and gone in 3.14). The Reaper, in turn, never calls
``waitpid(-1)``: it peeks with ``waitid(P_ALL, WNOWAIT)`` (which does not consume the status) and
reaps only pids nobody has claimed. Whoever starts a child and will wait for it claims the pid
while spawning (``Reaper.spawn``, or ``Reaper.holding`` + ``Reaper.own``); while a spawn is in
flight reaping is deferred, so a child that exits before it is claimed is not taken either.
A child started any other way (a bare ``subprocess.run``) can lose its status to the Reaper, and
subprocess then reports 0: every spawner in the process goes through one of those two doors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from cuzk_supervisor.daemon.childenv import child_environ
from cuzk_supervisor.exitcodes import SIGNAL_BASE

log = structlog.get_logger("supervisor.pid1")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# What a container runtime or an operator sends to stop us; all four terminate by default.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
)


# --- exit codes --------------------------------------------------------------------------------


def exit_code_for(child_returncode: int | None, signal_received: int | None) -> int:
    """The supervisor's own exit code.

    A signal we received wins (128 + N, the shell convention: 143 for SIGTERM): we were told to
    stop, whatever the child did on its way out. Otherwise the child's code, with a child killed
    by signal N (``returncode == -N``, as subprocess reports it) mapped to 128 + N. No child and
    no signal is 0.
    """
    if signal_received is not None:
        return SIGNAL_BASE + _checked_signal(signal_received)
    if child_returncode is None:
        return 0
    if child_returncode < 0:
        return SIGNAL_BASE + _checked_signal(-child_returncode)
    if child_returncode > 255:
        raise ValueError(f"an exit code is 0..255, got {child_returncode}")
    return child_returncode


def _checked_signal(signum: int) -> int:
    if not 1 <= signum <= 64:
        raise ValueError(f"not a signal number: {signum}")
    return signum


# --- PID 1 and the child subreaper ---------------------------------------------------------------


def is_pid1() -> bool:
    return os.getpid() == 1


def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to us instead of to PID 1 (Linux >= 3.4).

    Needed when we are not PID 1 (started in the background by a platform hook): without it the
    daemon's orphans escape our reaping and our cleanup. Returns False, with the reason logged,
    where it is unavailable.
    """
    libc = _libc()
    if libc is None:
        log.warning("pid1.subreaper_unavailable", reason=f"no prctl on {sys.platform}")
        return False
    # prctl reads its arguments as unsigned longs: pass them at that width.
    if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), *(ctypes.c_ulong(0),) * 3) != 0:
        errno = ctypes.get_errno()
        log.warning("pid1.subreaper_unavailable", reason=os.strerror(errno), errno=errno)
        return False
    log.info("pid1.subreaper", pid=os.getpid())
    return True


def is_subreaper() -> bool | None:
    """Whether this process is a child subreaper; None where that cannot be read."""
    libc = _libc()
    if libc is None:
        return None
    flag = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), *(ctypes.c_ulong(0),) * 3) != 0:
        return None
    return bool(flag.value)


# --- reaping -----------------------------------------------------------------------------------


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

    def __init__(self, on_reap: Callable[[Reaped], None] | None = None, keep: int = 256) -> None:
        self.reaped: collections.deque[Reaped] = collections.deque(maxlen=keep)  # latest, for logs
        self.reaped_total = 0
        self._on_reap = on_reap
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

    def disown(self, pid: int) -> None:
        with self._lock:
            self._owned.discard(pid)

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
        self.reaped_total += 1
        log.info("pid1.reaped", pid=pid, returncode=reaped.returncode)
        if self._on_reap is not None:
            self._on_reap(reaped)
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


# --- signal forwarding -------------------------------------------------------------------------


class SignalForwarder:
    """Passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to registered children.

    A child that leads its own process group (``start_new_session=True``) gets the signal on
    the whole group, so its own children hear it too; otherwise only the child does. The first
    terminating signal is kept in ``received`` (and released from ``wait()``) so the caller can
    shut down and exit with ``exit_code_for(..., received)``.
    """

    def __init__(
        self,
        signals: Iterable[int] = FORWARDED_SIGNALS,
        terminating: Iterable[int] | None = None,
    ) -> None:
        self.signals = tuple(signals)
        self.terminating = frozenset(self.signals if terminating is None else terminating)
        self.received: int | None = None
        self._children: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for signum in self.signals:
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def stop(self) -> None:
        if self._loop is not None:
            for signum in self.signals:
                self._loop.remove_signal_handler(signum)
            self._loop = None

    def add(self, pid: int) -> None:
        self._children.add(pid)

    def discard(self, pid: int) -> None:
        self._children.discard(pid)

    async def wait(self) -> int:
        """Wait for the first terminating signal; returns its number."""
        assert self._stopping is not None, "start() first"
        await self._stopping.wait()
        assert self.received is not None
        return self.received

    def forward(self, signum: int) -> None:
        for pid in sorted(self._children):
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signum)
                else:
                    os.kill(pid, signum)
            except ProcessLookupError:
                self._children.discard(pid)  # gone: nothing to forward to

    def _on_signal(self, signum: int) -> None:
        log.info("pid1.signal", signal=signal.Signals(signum).name, children=len(self._children))
        if signum in self.terminating and self.received is None:
            self.received = signum
            assert self._stopping is not None
            self._stopping.set()
        self.forward(signum)


# --- cleanup -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KillReport:
    """What ``kill_tree`` found: who left on SIGTERM, who needed SIGKILL, who is still there."""

    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    survivors: tuple[int, ...]  # not gone even after SIGKILL (e.g. stuck in a driver call)


def kill_tree(root_pids: Iterable[int], grace_s: float, kill_wait_s: float = 5.0) -> KillReport:
    """Stop the roots, all their descendants and their process groups; wait until all exited.

    SIGTERM to everyone, SIGKILL to whatever is still running after ``grace_s``. Descendants that
    were orphaned earlier are still found through the roots' process groups. Exited children of
    ours stay as zombies for their waiter (or the Reaper) to collect: this never reaps. It
    blocks; from async code call it through ``asyncio.to_thread``.
    """
    me, my_group = os.getpid(), os.getpgrp()
    # Never ourselves, nor an ancestor: its tree would contain us and our siblings.
    spared = {me, *(parent.pid for parent in psutil.Process().parents())}
    roots = [pid for pid in root_pids if pid not in spared]
    # A root that started its own group gave it its pid; a group outlives its leader.
    groups = {pid for pid in roots if pid != my_group}
    found = _processes(roots, groups)
    _signal_all(found, groups, signal.SIGTERM)
    left = _wait_exited(found, grace_s)
    terminated = tuple(sorted(found.keys() - left.keys()))
    if not left:
        log.info("pid1.tree_stopped", terminated=len(terminated))
        return KillReport(terminated, (), ())
    # Also whatever the survivors started during the grace period (zombies need no SIGKILL).
    left = {pid: p for pid, p in (_processes(list(left), groups) | left).items() if _running(p)}
    _signal_all(left, groups, signal.SIGKILL)
    survivors = _wait_exited(left, kill_wait_s)
    killed = tuple(sorted(left.keys() - survivors.keys()))
    report = KillReport(terminated, killed, tuple(sorted(survivors)))
    log.warning(
        "pid1.tree_killed", terminated=len(terminated), killed=killed, survivors=report.survivors
    )
    return report


def kill_descendants(grace_s: float, kill_wait_s: float = 5.0) -> KillReport:
    """``kill_tree`` of all our children: the last step on every exit path."""
    children = [child.pid for child in psutil.Process().children()]
    return kill_tree(children, grace_s, kill_wait_s)


def _processes(roots: list[int], groups: set[int]) -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            found[pid] = root
            found |= {child.pid: child for child in root.children(recursive=True)}
    if groups:
        for pid in psutil.pids():
            with contextlib.suppress(OSError, psutil.NoSuchProcess):
                if os.getpgid(pid) in groups and pid not in found:
                    found[pid] = psutil.Process(pid)
    found.pop(os.getpid(), None)
    return found


def _signal_all(procs: dict[int, psutil.Process], groups: set[int], signum: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
    for proc in procs.values():
        # psutil checks the process is still the one we found (no pid reuse).
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signum)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_exited(procs: dict[int, psutil.Process], timeout_s: float) -> dict[int, psutil.Process]:
    """The processes still running after at most ``timeout_s``.

    Polled: most of them are not our children, so there is no exit event to await, and waiting
    on our own children here would steal their status from their waiter.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        left = {pid: proc for pid, proc in procs.items() if _running(proc)}
        remaining = deadline - time.monotonic()
        if not left or remaining <= 0:
            return left
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.05)
