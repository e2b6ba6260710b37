"""Children a killed supervisor left running (the params fetch, worker commands): find and stop
them before starting their successors (issue 13, item 5).

Such a child runs in its own session, so a SIGKILLed supervisor that is not PID 1 leaves it
running; a restarted supervisor would start a second fetch writing the same files at once. Two
marks find it: its pid and start time in a pidfile (in the state folder), written right after the
spawn; and two variables in its environment, inherited by everything it starts (even a grandchild
that escaped with ``setsid``, and a child spawned just before a SIGKILL that beat the pidfile):
:data:`ROLE_VAR` says what it is for (``fetch:/data/zk/params``, ``worker:curio:<command>``) and
:data:`OWNER_VAR` which supervisor started it. Only children whose owner is no longer running are
stopped: a live supervisor's child (another supervisor's on the same host, or ours) never is.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import structlog

from cuzk_supervisor import killtree
from cuzk_supervisor.adapters import files

log = structlog.get_logger()

ROLE_VAR = "CUZK_SUPERVISOR_CHILD_ROLE"
OWNER_VAR = "CUZK_SUPERVISOR_CHILD_OWNER"


def _identity(proc: psutil.Process) -> str:
    return f"{proc.pid}:{proc.create_time():.3f}"


_SELF: str | None = None


def owner() -> str:
    """This supervisor: ``pid:start time`` (a pid alone may be reused after a restart)."""
    global _SELF
    if _SELF is None or not _SELF.startswith(f"{os.getpid()}:"):
        _SELF = _identity(psutil.Process())
    return _SELF


def env_marks(role: str) -> dict[str, str]:
    """The variables to add to a child's environment so a later supervisor can find it."""
    return {ROLE_VAR: role, OWNER_VAR: owner()}


def owner_alive(identity: str) -> bool:
    """Whether the supervisor ``identity`` (``pid:start time``) still runs.

    A zombie does not: a SIGKILLed supervisor stays one until its parent (an on-start hook's
    shell, the platform's init) collects it, which may be after its successor has started and
    looked for leftovers (issue 46). Its pid and start time still read as before, so without
    this its children were taken for a live supervisor's and spared."""
    pid_text, _, started = identity.partition(":")
    try:
        proc = psutil.Process(int(pid_text))
        same = _identity(proc) == f"{pid_text}:{float(started):.3f}"
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def record(pidfile: Path, pid: int) -> None:
    """Write ``pid`` and its start time; a failure is a warning (the environment marks remain)."""
    try:
        started = psutil.Process(pid).create_time()
        files.atomic_write(pidfile, f"{pid} {started}\n".encode(), files.FILE_MODE)
    except psutil.Error:
        pass  # already gone
    except OSError as exc:
        log.warning("child.pidfile_unwritable", path=str(pidfile), reason=files.describe(exc))


def forget(pidfile: Path) -> None:
    with contextlib.suppress(OSError):
        pidfile.unlink(missing_ok=True)


def _from_pidfile(pidfile: Path) -> int | None:
    try:
        pid_text, started_text = files.read_regular(pidfile, 4096).decode().split()
        proc = psutil.Process(int(pid_text))
        same = abs(proc.create_time() - float(started_text)) < 0.01
        if same and proc.status() != psutil.STATUS_ZOMBIE:  # a zombie is stopped already
            return proc.pid
    except (OSError, ValueError, UnicodeDecodeError, psutil.Error):
        pass
    return None


def find(role: str, pidfile: Path | None = None) -> list[int]:
    """Pids of processes for ``role`` whose supervisor is gone (never ours, never a live one's)."""
    found: set[int] = set()
    me = owner()
    if pidfile is not None and (pid := _from_pidfile(pidfile)) is not None:
        found.add(pid)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            if env.get(ROLE_VAR) == role:
                found.add(proc.pid)
            elif proc.pid not in found:
                continue
            # A pidfile's process whose environment says it belongs to a live supervisor (or
            # to us) is not a leftover.
            started_by = env.get(OWNER_VAR)
            if started_by is not None and (started_by == me or owner_alive(started_by)):
                found.discard(proc.pid)
    return sorted(found)


def reclaim(role: str, pidfile: Path | None, grace_s: float) -> list[int]:
    """Stop what :func:`find` finds (SIGTERM, SIGKILL after ``grace_s``, their whole groups) and
    remove the pidfile. Blocks: from async code call it through ``asyncio.to_thread``."""
    stale = find(role, pidfile)
    if stale:
        log.warning("child.leftover_stopped", role=role, pids=stale)
        killtree.kill_tree(stale, grace_s)
    if pidfile is not None:
        forget(pidfile)
    return stale
