"""Params phase: skip when present, fetch with progress from bytes on disk, verify, fail clearly."""

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from leftoverhelpers import (
    careful_fetch_command,
    files_whole,
    journal_lines,
    kill_marked,
    marked,
)
from simhelpers import poll_until
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.params import (
    ExpectedFile,
    ParamsFailed,
    Progress,
    ensure_params,
    fetch_role,
    missing,
    parse_expected,
    progress,
)
from cuzk_supervisor.daemon import leftovers
from cuzk_supervisor.daemon.workers import CommandProcess


def test_progress_percent_rate_eta():
    p = progress([(0.0, 0), (10.0, 100 * 1024**2)], total_bytes=400 * 1024**2, started_at=0.0)
    assert p.percent == pytest.approx(25.0)
    assert p.rate_bytes_s == pytest.approx(10 * 1024**2)
    assert p.eta_s == pytest.approx(30.0)
    fields = p.fields()
    assert (fields["percent"], fields["eta_s"]) == (25.0, 30)
    assert (fields["done_bytes"], fields["rate_bytes_s"]) == (100 * 1024**2, 10 * 1024**2)


def test_missing_names_wrong_and_absent_files():
    expected = parse_expected(["a.params:10", "b.vk:20"])
    assert missing(expected, {"a.params": 10, "b.vk": None}) == ["b.vk (have none, want 20)"]
    assert missing(expected, {"a.params": 9, "b.vk": 20}) == ["a.params (have 9, want 10)"]


def _writer_command(tmp_path, sizes, chunks=20, pause=0.05):
    """A fetch command that writes the files slowly (a real child process)."""
    script = tmp_path / "fetch.py"
    script.write_text(
        "import sys, time\n"
        f"sizes = {sizes!r}\n"
        "for name, size in sizes.items():\n"
        "    with open(name, 'wb') as f:\n"
        f"        for i in range({chunks}):\n"
        f"            f.write(b'x' * (size // {chunks})); f.flush(); time.sleep({pause})\n"
        f"        f.write(b'x' * (size - (size // {chunks}) * {chunks}))\n"
        "    print('fetched', name, flush=True)\n"
    )
    return f"{sys.executable} {script}"


async def test_fetch_shows_progress_then_skips_next_time(tmp_path):
    folder = tmp_path / "params"
    sizes = {"a.params": 2_000_000, "b.vk": 1_000_000}
    expected = [ExpectedFile(n, s) for n, s in sizes.items()]
    seen: list[Progress] = []
    outcome = await ensure_params(
        folder, expected, _writer_command(tmp_path, sizes), timeout_s=60,
        progress_interval_s=0.1, on_progress=seen.append,
    )  # fmt: skip
    assert outcome.fetched
    assert len(seen) >= 3
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)
    assert any(0 < (p.percent or 0) < 100 for p in seen)
    assert outcome.progress is not None
    assert outcome.progress.done_bytes == sum(sizes.values())
    again = await ensure_params(folder, expected, "exit 1", timeout_s=60, progress_interval_s=0.1)
    assert not again.fetched


async def test_fetch_command_failing_is_a_reason(tmp_path):
    with pytest.raises(ParamsFailed, match="code 3"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "echo nope; exit 3", timeout_s=30,
            progress_interval_s=0.1,
        )  # fmt: skip


async def test_fetch_command_hanging_is_stopped_after_the_timeout(tmp_path):
    with pytest.raises(ParamsFailed, match=r"still running after 0\.5 s"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "sleep 600", timeout_s=0.5,
            progress_interval_s=0.1, stop_grace_s=0.5,
        )  # fmt: skip


async def test_fetch_that_writes_wrong_sizes_fails_verification(tmp_path):
    with pytest.raises(ParamsFailed, match=r"a\.params"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a.params", 10)], "printf abc > a.params",
            timeout_s=30, progress_interval_s=0.1,
        )  # fmt: skip


async def test_missing_params_without_a_fetch_command_fail(tmp_path):
    with pytest.raises(ParamsFailed, match="no fetch command"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "", timeout_s=30, progress_interval_s=0.1
        )


# --- no two fetches (issue 13, item 5) ----------------------------------------------------------

_SUPERVISOR = """
import asyncio, sys
from pathlib import Path
from cuzk_supervisor.adapters.params import ExpectedFile, ensure_params
folder, pidfile, command = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
expected = [ExpectedFile(n, int(s)) for n, _, s in (a.rpartition(":") for a in sys.argv[4:])]
asyncio.run(ensure_params(folder, expected, command, timeout_s=120, progress_interval_s=0.1,
                          pidfile=pidfile))
"""


def _start_supervisor(tmp_path, folder, pidfile, command, sizes):
    """ensure_params in a process of its own: the supervisor to SIGKILL."""
    script = tmp_path / "supervisor_params.py"
    script.write_text(_SUPERVISOR)
    specs = [f"{n}:{s}" for n, s in sizes.items()]
    return _popen(sys.executable, str(script), str(folder), str(pidfile), command, *specs)


def _popen(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1])


async def test_a_fetch_left_by_a_killed_supervisor_is_stopped_before_a_new_one(tmp_path):
    folder = tmp_path / "params"
    pidfile = tmp_path / "state" / "fetch.pid"
    sizes = {"a.params": 400_000, "b.vk": 100_000}
    expected = [ExpectedFile(n, s) for n, s in sizes.items()]
    role = fetch_role(folder)
    slow = careful_fetch_command(tmp_path, sizes, pause=0.5, escape=True)
    first = _start_supervisor(tmp_path, folder, pidfile, slow, sizes)
    try:
        # Mid-fetch: its pid recorded, bytes on disk, the escaped grandchild up.
        poll_until(lambda: pidfile.exists() and (folder / "a.params").exists(), 30,
                   what="fetch running")  # fmt: skip
        poll_until(lambda: len(marked(role)) >= 3, 30, what="sh, fetch and grandchild")
        first.kill()
        first.wait(10)
        left = marked(role)
        assert len(left) >= 3, "the SIGKILL took the fetch with it: the test tests nothing"
        # The restart: a new supervisor (this test process), the same folder and state folder.
        with capture_logs() as logs:
            outcome = await ensure_params(
                folder, expected, careful_fetch_command(tmp_path, sizes, pause=0.01),
                timeout_s=60, progress_interval_s=0.1, pidfile=pidfile,
            )  # fmt: skip
        assert outcome.fetched
        lines = journal_lines(tmp_path)
        assert not [line for line in lines if line.startswith("overlap")], lines
        assert [line.split()[0] for line in lines] == ["start", "start", "end"]
        assert files_whole(folder, sizes)
        # Found holding the params lock (the escaped grandchild by its marks), stopped at once.
        stopped = [e for e in logs if e["event"] == "params.lock_holders_stopped"]
        assert len(stopped) == 1
        assert {p.pid for p in left} <= set(stopped[0]["pids"])
        assert "which is gone" in stopped[0]["reason"]
        assert not any(p.is_running() and p.status() != "zombie" for p in left)
        assert not pidfile.exists()
        assert marked(role) == []
    finally:
        first.kill()
        kill_marked(role)


async def test_a_live_supervisors_fetch_is_never_stopped(tmp_path):
    """Only a dead supervisor's children are leftovers: another running supervisor fetching
    into the same folder keeps its fetch."""
    folder = tmp_path / "params"
    sizes = {"a.params": 200_000}
    role = fetch_role(folder)
    other = _start_supervisor(tmp_path, folder, tmp_path / "other.pid",
                              careful_fetch_command(tmp_path, sizes, pause=0.5), sizes)  # fmt: skip
    try:
        poll_until(lambda: len(marked(role)) >= 2, 30, what="the other fetch running")
        before = {p.pid for p in marked(role)}
        assert leftovers.find(role, None) == []
        assert before <= {p.pid for p in marked(role)}
    finally:
        other.kill()
        other.wait(10)
        kill_marked(role)


async def test_a_worker_left_by_a_killed_supervisor_is_stopped_before_a_new_one(tmp_path):
    command = f"{sys.executable} -c 'import time; time.sleep(300)'"
    script = tmp_path / "supervisor_worker.py"
    script.write_text(
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from cuzk_supervisor.daemon.workers import CommandProcess\n"
        "async def main():\n"
        "    proc = CommandProcess(sys.argv[1], source='curio', stop_grace_s=1,\n"
        "                          pid_dir=Path(sys.argv[2]))\n"
        "    await proc.start()\n"
        "    await proc.wait()\n"
        "asyncio.run(main())\n"
    )
    state = tmp_path / "state"
    first = _popen(sys.executable, str(script), command, str(state))
    worker = CommandProcess(command, source="curio", stop_grace_s=1, pid_dir=state)
    try:
        poll_until(lambda: (state / "worker-curio.pid").exists(), 30, what="worker pidfile")
        poll_until(lambda: len(marked(worker.role)) >= 2, 30, what="sh and its child")
        first.kill()
        first.wait(10)
        left = marked(worker.role)
        assert len(left) >= 2
        await worker.start()
        assert not any(p.is_running() and p.status() != "zombie" for p in left)
        assert {p.pid for p in marked(worker.role)} >= {worker.pid}
        await worker.stop()
        assert not (state / "worker-curio.pid").exists()
        assert marked(worker.role) == []
    finally:
        first.kill()
        kill_marked(worker.role)


async def test_a_leftover_fetch_without_its_marks_is_found_by_its_pidfile(tmp_path):
    """A fetch that cleared its environment (``env -i``) is found by the pid recorded in the
    state folder, and only while that pid is still the same process (its start time)."""
    folder = tmp_path / "params"
    pidfile = tmp_path / "state" / "fetch.pid"
    first = _start_supervisor(tmp_path, folder, pidfile, "exec env -i sleep 300", {"a": 1})
    pid = 0
    try:
        poll_until(lambda: pidfile.exists(), 30, what="pidfile")
        pid = int(pidfile.read_text().split()[0])
        poll_until(lambda: psutil.Process(pid).name() == "sleep", 30, what="env -i sleep")
        assert leftovers.ROLE_VAR not in psutil.Process(pid).environ()
        first.kill()
        first.wait(10)
        assert psutil.Process(pid).is_running()
        assert leftovers.reclaim(fetch_role(folder), pidfile, 1.0) == [pid]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert not pidfile.exists()
    finally:
        first.kill()
        if pid:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_a_killed_supervisor_not_yet_collected_is_no_owner(tmp_path):
    """A SIGKILLed supervisor is a zombie until its parent collects it, its pid and start time
    unchanged: its fetch is a leftover all the same (issue 46: the race a restart right after a
    SIGKILL lost)."""
    folder = tmp_path / "params"
    pidfile = tmp_path / "state" / "fetch.pid"
    role = fetch_role(folder)
    first = _start_supervisor(tmp_path, folder, pidfile,
                              careful_fetch_command(tmp_path, {"a": 200_000}, pause=0.5),
                              {"a": 200_000})  # fmt: skip
    try:
        poll_until(lambda: len(marked(role)) >= 2, 30, what="the fetch running")
        owner = marked(role)[0].environ()[leftovers.OWNER_VAR]
        assert leftovers.owner_alive(owner)
        first.kill()  # not collected yet: a zombie
        poll_until(lambda: psutil.Process(first.pid).status() == "zombie", 30, what="a zombie")
        assert not leftovers.owner_alive(owner)
        assert set(leftovers.find(role, pidfile)) >= {p.pid for p in marked(role)}
    finally:
        first.kill()
        first.wait(10)
        kill_marked(role)
