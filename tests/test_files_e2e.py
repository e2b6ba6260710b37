"""Issue 13, items 2, 5 and 6, end to end (real processes: the supervisor, the sim manager and
daemon): the modes under ``umask 000``, a full disk under each folder, a FIFO as the state file,
a world-writable state folder, a SIGKILL mid-fetch then a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemonhelpers import Supervisor
from fshelpers import full_tmpfs
from leftoverhelpers import careful_fetch_command, files_whole, journal_lines, kill_marked, marked
from lifecyclehelpers import lifecycle_env, start_run
from scripted import FULL_LOGS
from simhelpers import poll_until

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters import paramslock
from cuzk_supervisor.adapters.params import fetch_role

pytestmark = pytest.mark.slow


def _finish(run: Supervisor, timeout: float = 120) -> int:
    try:
        return run.wait(timeout)
    finally:
        run.kill()


def _instance_logs(mgr: Any) -> str:
    (instance,) = mgr.status()
    lines = mgr.get(f"/api/instance-logs/{instance['uuid']}", params={"tail": "10000"}).json()
    return "\n".join(line["text"] for line in lines)


def _no_traceback(run: Supervisor) -> None:
    text = run.stderr_text()
    assert "Traceback" not in text, run.describe()
    assert "supervisor.crashed" not in text, run.describe()
    assert "ExceptionGroup" not in text, run.describe()


def _world_writable(folders: list[Path]) -> list[str]:
    found = []
    for top in folders:
        for root, dirs, names in os.walk(top):
            for name in [*dirs, *names, "."]:
                path = Path(root) / name
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    continue
                if info.st_mode & stat.S_IWOTH:
                    found.append(f"{path} {stat.filemode(info.st_mode)}")
    return found


def test_under_umask_0_nothing_the_supervisor_creates_is_world_writable(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2)
    run = Supervisor([], prefix=("sh", "-c", 'umask 000 && exec "$@"', "sh"), command="run",
                     env=env)  # fmt: skip
    # The umask did reach the supervisor (after the exec, while it runs).
    status = Path(f"/proc/{run.proc.pid}/status")
    poll_until(lambda: "python" in status.read_text(), 10, what="exec")
    assert "Umask:\t0000" in status.read_text()
    assert _finish(run) == exitcodes.OK, run.describe()
    folders = [tmp_path / name for name in ("state", "run", "log", "params")]
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750, folder
    assert stat.S_IMODE((tmp_path / "state" / "state.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "run" / "cuzk.toml").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "log" / "cuzk.log").stat().st_mode) == 0o640
    assert stat.S_IMODE(paramslock.lock_path(tmp_path / "params").stat().st_mode) == 0o600
    assert _world_writable(folders) == []


@pytest.mark.parametrize(
    ("folder", "code", "reason"),
    [
        ("run", exitcodes.DAEMON_FAILED_TO_START, "cannot write daemon config"),
        ("log", exitcodes.OK, "cannot write log file"),
        # Before /register (the phase is saved first): no instance to tell, nothing sent.
        ("state", exitcodes.STATE_UNWRITABLE, ""),
    ],
)
def test_a_full_disk_under_a_folder_ends_with_its_exit_code(tmp_path, manager, folder, code,
                                                            reason):  # fmt: skip
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2, **FULL_LOGS)
    with full_tmpfs(tmp_path / folder):
        run = start_run(env)
        try:
            assert run.wait(120) == code, run.describe()
        finally:
            run.kill()
    _no_traceback(run)
    assert "No space left on device" in run.stderr_text()
    if reason:
        logs = _instance_logs(mgr)
        assert reason in logs
        assert "No space left on device" in logs
    else:
        assert "cannot write state file" in run.stderr_text()
        assert mgr.requests(path="/register") == []


def test_a_fifo_as_the_state_file_is_moved_aside_and_the_run_completes(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2, **FULL_LOGS)
    (tmp_path / "state").mkdir()
    os.mkfifo(tmp_path / "state" / "state.json")
    run = start_run(env)
    assert _finish(run) == exitcodes.OK, run.describe()
    _no_traceback(run)
    (corrupt,) = run.named("state.corrupt")
    assert "FIFO" in corrupt["problem"]
    assert stat.S_ISFIFO(os.lstat(corrupt["moved_to"]).st_mode)
    assert stat.S_ISREG(os.lstat(tmp_path / "state" / "state.json").st_mode)
    assert "state.corrupt" in _instance_logs(mgr)


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` as a read-only bind mount of itself: its mode cannot be changed."""
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True,
                           check=False)  # fmt: skip
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_world_writable_state_folder_is_fixed_or_refused(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2)
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    with _read_only(state):
        refused = start_run(env)
        assert _finish(refused, 30) == exitcodes.USAGE
        assert "world-writable" in refused.stderr_text()
        _no_traceback(refused)
    assert mgr.requests(path="/register") == []
    fixed = start_run(env)
    assert _finish(fixed) == exitcodes.OK, fixed.describe()
    assert fixed.named("state.folder_mode_fixed")
    assert not state.stat().st_mode & stat.S_IWOTH


def test_sigkill_during_a_slow_fetch_then_a_restart_runs_one_fetch_at_a_time(tmp_path, manager):
    mgr = manager()
    sizes = {"p.params": 3_000_000, "p.vk": 1000}
    slow = careful_fetch_command(tmp_path, sizes, pause=0.5, escape=True)
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2,
                        params_fetch_command=slow)  # fmt: skip
    role = fetch_role(tmp_path / "params")
    try:
        first = start_run(env)
        poll_until(lambda: first.named("params.progress"), 60, what="fetch in progress")
        first.signal(signal.SIGKILL)
        first.wait(10)
        assert marked(role), "the fetch died with its supervisor: the test tests nothing"
        env["CUZK_SUPERVISOR_PARAMS_FETCH_COMMAND"] = careful_fetch_command(
            tmp_path, sizes, pause=0.01
        )
        second = start_run(env)
        assert _finish(second) == exitcodes.OK, second.describe()
        _no_traceback(second)
        lines = journal_lines(tmp_path)
        assert [line.split()[0] for line in lines] == ["start", "start", "end"], lines
        assert files_whole(tmp_path / "params", sizes)
        assert second.named("params.lock_holders_stopped")
        assert marked(role) == []
    finally:
        kill_marked(role)


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_a_fifo_or_device_where_the_daemon_log_should_be_is_a_start_failure(tmp_path, manager,
                                                                           kind):  # fmt: skip
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=2)
    (tmp_path / "log").mkdir()
    path = tmp_path / "log" / "cuzk.log"
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null
    run = start_run(env)
    assert _finish(run, 60) == exitcodes.DAEMON_FAILED_TO_START, run.describe()
    _no_traceback(run)
    assert f"cannot write log file {path}: not a regular file (a {kind})" in _instance_logs(mgr)
