"""Stop a process tree and everything in its process groups, and wait until all of it exited.

The last step on every exit path (nothing the supervisor started may outlive it), and how a
daemon's leftovers are cleared. It never reaps: exited children stay for their waiter (or the
:class:`cuzk_supervisor.reaper.Reaper`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil
import structlog

log = structlog.get_logger("supervisor.pid1")


@dataclass(frozen=True)
class KillReport:
    """What ``kill_tree`` found: who left on SIGTERM, who needed SIGKILL, who is still there."""

    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    survivors: tuple[int, ...]  # not gone even after SIGKILL (e.g. stuck in a driver call)


def kill_tree(root_pids: Iterable[int], grace_s: float, kill_wait_s: float = 5.0) -> KillReport:
    """Stop the roots, all their descendants and their process groups; wait until all exited.

    SIGTERM to everyone, SIGKILL to whatever is still running after ``grace_s``. Descendants that
    were orphaned earlier are still found through the roots' process groups. It blocks; from async
    code call it through ``asyncio.to_thread``. Logged only when it found something to stop
    (``pid1.tree_stopped``, or ``pid1.tree_killed`` when SIGKILL was needed): a tree that is
    already gone is the usual case after a clean exit and says nothing.
    """
    me, my_group = os.getpid(), os.getpgrp()
    # Never ourselves, nor an ancestor: its tree would contain us and our siblings.
    spared = {me, *(parent.pid for parent in psutil.Process().parents())}
    roots = [pid for pid in root_pids if pid not in spared]
    # A root that started its own group gave it its pid; a group outlives its leader.
    groups = {pid for pid in roots if pid != my_group}
    # Zombies hold nothing and need no signal: only running members count as stopped.
    found = {pid: proc for pid, proc in _processes(roots, groups).items() if _running(proc)}
    _signal_all(found, groups, signal.SIGTERM)
    left = _wait_exited(found, grace_s)
    terminated = tuple(sorted(found.keys() - left.keys()))
    if not left:
        if terminated:
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


def kill_descendants(grace_s: float, spare: Iterable[int] = ()) -> KillReport:
    """``kill_tree`` of all our children but ``spare`` (children their starter stops itself,
    after us): the last step on every exit path."""
    kept = set(spare)
    children = [child.pid for child in psutil.Process().children() if child.pid not in kept]
    return kill_tree(children, grace_s)


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
