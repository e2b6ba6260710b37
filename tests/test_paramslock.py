"""The params lock (issue 46): a flock the fetch and all it starts hold, released by the kernel
with its last holder; who holds it, what is stopped, what is waited for, how the file is made."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from pacehelpers import patient
from simhelpers import poll_until
from structlog.testing import capture_logs

from cuzk_supervisor.adapters import paramslock
from cuzk_supervisor.adapters.params import ExpectedFile, ParamsFailed, ensure_params
from cuzk_supervisor.adapters.paramslock import Held, LockUnavailable

# A "supervisor" taking the lock with the kernel's calls alone, then starting a grandchild in a
# session of its own with the descriptor (as a fetch's escaped helper would); both block on
# their stdin (a pipe the test holds) until it closes. Prints the grandchild's pid.
_TAKER = """
import fcntl, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
grand = subprocess.Popen(["setsid", sys.executable, "-c", "import sys; sys.stdin.read()"],
                         pass_fds=(fd,))
print(grand.pid, flush=True)
sys.stdin.read()
"""


class Taker:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _TAKER, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert self.proc.stdout is not None
        self.grandchild = int(self.proc.stdout.readline())

    def release(self) -> None:
        """EOF on their stdin: the taker and its grandchild exit."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def cleanup(self) -> None:
        for pid in (self.proc.pid, self.grandchild):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _lock(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    return paramslock.lock_path(folder)


def _free(path: Path) -> bool:
    got = paramslock.attempt(path)
    if isinstance(got, int):
        os.close(got)
        return True
    return False


def test_a_grandchild_holding_the_descriptor_keeps_the_lock_after_its_parent_died(tmp_path):
    path = _lock(tmp_path)
    taker = Taker(path)
    try:
        taker.proc.kill()  # the parent dies, SIGKILLed
        taker.proc.wait(10)
        assert _running(taker.grandchild)
        got = paramslock.attempt(path)
        # Still held, by the grandchild alone; the kernel still names its dead taker.
        assert isinstance(got, Held)
        assert got.locker == taker.proc.pid
        assert paramslock.holders(got) == [taker.grandchild]
        taker.release()  # the last holder exits: the kernel releases the lock
        poll_until(lambda: not _running(taker.grandchild), 30, what="the grandchild gone")
        assert _free(path)
    finally:
        taker.cleanup()


def test_a_lock_proc_locks_names_otherwise_is_told_by_its_holders_descriptors(tmp_path):
    """overlayfs and btrfs name a file in /proc/locks otherwise than stat does: the taker is
    then read from the descriptors holding the lock (here a /proc whose locks list is empty)."""
    path = _lock(tmp_path / "params")
    taker = Taker(path)
    try:
        proc = tmp_path / "proc"
        proc.mkdir()
        (proc / "locks").write_text("")
        for pid in (taker.proc.pid, taker.grandchild):
            (proc / str(pid)).symlink_to(f"/proc/{pid}")
        got = paramslock.attempt(path, proc)
        assert isinstance(got, Held)
        assert got.locker == taker.proc.pid
        assert paramslock.holders(got, proc) == sorted([taker.proc.pid, taker.grandchild])
    finally:
        taker.cleanup()


def test_a_dead_takers_holders_are_stopped_and_the_lock_taken(tmp_path):
    """The taker killed and not yet collected (a zombie): its grandchild is stopped at once."""
    path = _lock(tmp_path)
    taker = Taker(path)
    try:
        os.kill(taker.proc.pid, signal.SIGKILL)  # no wait(): a zombie until the cleanup
        poll_until(lambda: not _running(taker.proc.pid), 30, what="the taker a zombie")
        with capture_logs() as logs:
            asyncio.run(_hold_once(tmp_path, wait_s=patient(30)))
        stopped = [e for e in logs if e["event"] == "params.lock_holders_stopped"]
        assert [e["pids"] for e in stopped] == [[taker.grandchild]]
        assert f"supervisor {taker.proc.pid}, which is gone" in stopped[0]["reason"]
        assert not _running(taker.grandchild)
        assert _free(path)  # released at the end of the block
    finally:
        taker.cleanup()


async def _hold_once(folder: Path, wait_s: float) -> None:
    async with paramslock.held(folder, role="fetch:test", pidfile=None, wait_s=wait_s,
                               grace_s=1.0):  # fmt: skip
        assert not _free(paramslock.lock_path(folder))  # a second description is kept out


def test_a_running_takers_lock_is_waited_for_then_a_failure_with_the_reason(tmp_path):
    path = _lock(tmp_path)
    taker = Taker(path)
    try:
        with capture_logs() as logs, pytest.raises(LockUnavailable) as failed:
            asyncio.run(_hold_once(tmp_path, wait_s=0.3))
        reason = str(failed.value)
        assert f"supervisor {taker.proc.pid} (still running)" in reason
        assert f"{path} is still held after 0.3 s" in reason
        assert f"{taker.proc.pid}, {taker.grandchild}" in reason
        waits = [e for e in logs if e["event"] == "params.lock_wait"]
        assert len(waits) == 1  # one line, not one a poll
        assert waits[0]["pid"] == taker.proc.pid
        assert not [e for e in logs if e["event"] == "params.lock_holders_stopped"]
        assert _running(taker.proc.pid)
        assert _running(taker.grandchild)
    finally:
        taker.cleanup()


async def test_the_wait_ends_when_the_running_taker_lets_go(tmp_path):
    taker = Taker(_lock(tmp_path))
    try:
        with capture_logs() as logs:
            holding = asyncio.create_task(_hold_once(tmp_path, wait_s=patient(60)))
            deadline = time.monotonic() + patient(30)
            while not [e for e in logs if e["event"] == "params.lock_wait"]:
                assert time.monotonic() < deadline, "no params.lock_wait line"
                assert not holding.done()
                await asyncio.sleep(0.01)
            os.kill(taker.grandchild, signal.SIGKILL)  # the taker last: it lets go
            poll_until(lambda: not _running(taker.grandchild), 30, what="the grandchild gone")
            taker.release()
            await holding
        assert [e["event"] for e in logs if e["event"].startswith("params.lock")] == [
            "params.lock_wait", "params.lock_taken",
        ]  # fmt: skip
    finally:
        taker.cleanup()


def test_the_lock_file_is_ours_whatever_the_umask_and_never_through_a_link(tmp_path):
    path = _lock(tmp_path)
    old = os.umask(0o277)
    try:
        assert _free(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o666)
    assert _free(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.unlink()
    target = tmp_path / "precious"
    target.write_text("keep")
    path.symlink_to(target)
    with pytest.raises(LockUnavailable, match="symbolic link"):
        asyncio.run(_hold_once(tmp_path, wait_s=1))
    path.unlink()
    os.link(target, path)
    with pytest.raises(LockUnavailable, match="2 names for it"):
        asyncio.run(_hold_once(tmp_path, wait_s=1))
    assert target.read_text() == "keep"


_HAS_FD = "import os, sys; os.fstat(int(sys.argv[1]))"


async def test_the_descriptor_reaches_no_child_it_is_not_passed_to(tmp_path):
    """Close-on-exec: a child started while the lock is held (the daemon, a worker command)
    does not get it, even one started without closing descriptors."""
    async with paramslock.held(tmp_path, role="fetch:test", pidfile=None, wait_s=1,
                               grace_s=1.0) as fd:  # fmt: skip
        plain = await _exit_code(fd, passed=False)
        passed = await _exit_code(fd, passed=True)
    assert (plain, passed) == (1, 0)  # EBADF in the first, whose descriptors were all kept


async def _exit_code(fd: int, passed: bool) -> int:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HAS_FD, str(fd), stderr=subprocess.DEVNULL,
        **({"pass_fds": (fd,)} if passed else {"close_fds": False}),
    )  # fmt: skip
    return await child.wait()


def _descriptors_of(path: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.path.samefile(f"/proc/self/fd/{fd}", path):
                found.append(fd)
        except OSError:
            continue
    return found


# A fetch whose helper escapes into a session of its own with the lock and outlives it.
_STRAGGLER = "printf 1234 > a; setsid {python} -c 'import time; time.sleep(300)' & echo started"


async def test_a_fetch_that_leaves_a_helper_holding_the_lock_is_verified_after_it_stops(tmp_path):
    folder = tmp_path / "params"
    with capture_logs() as logs:
        outcome = await ensure_params(
            folder, [ExpectedFile("a", 4)], _STRAGGLER.format(python=sys.executable),
            timeout_s=60, progress_interval_s=0.1, lock_wait_s=patient(30),
        )  # fmt: skip
    assert outcome.fetched
    stopped = [e for e in logs if e["event"] == "params.lock_holders_stopped"]
    assert len(stopped) == 1
    assert "our fetch has ended" in stopped[0]["reason"]
    assert not any(_running(pid) for pid in stopped[0]["pids"])
    assert _descriptors_of(paramslock.lock_path(folder)) == []  # released: kept by nobody
    assert _free(paramslock.lock_path(folder))


async def test_a_lock_held_past_the_wait_fails_the_params_phase_with_its_reason(tmp_path):
    folder = tmp_path / "params"
    taker = Taker(_lock(folder))
    try:
        with pytest.raises(ParamsFailed, match=r"still running\) is fetching into the same"):
            await ensure_params(
                folder, [ExpectedFile("a", 4)], "printf 1234 > a", timeout_s=60,
                progress_interval_s=0.1, lock_wait_s=0.2,
            )  # fmt: skip
        assert not (folder / "a").exists()  # nothing fetched beside it
    finally:
        taker.cleanup()
