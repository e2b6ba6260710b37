"""PID-1 duties with real processes: subreaper, reaping, signal forwarding, tree cleanup.

Anything that reaps or makes a subreaper runs in a small script of its own, so the pytest process
neither becomes a subreaper nor collects children that other tests' fixtures will wait for.
Synchronisation is by pipes and by polling /proc with a deadline, never by a fixed sleep.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from pacehelpers import patient
from structlog.testing import capture_logs

from cuzk_supervisor import pid1
from cuzk_supervisor.killtree import kill_tree
from cuzk_supervisor.pid1 import exit_code_for
from cuzk_supervisor.reaper import Reaper

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 10.0


def _until(condition: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + patient(timeout)
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.005)
    return value


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting to be collected."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# Shared by the scripts below: poll with a deadline, read /proc.
PRELUDE = r"""
import asyncio, json, os, signal, subprocess, sys, time
from cuzk_supervisor import pid1
from cuzk_supervisor.reaper import Reaper

async def until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.005)
    return value

def proc_field(pid, name):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(name + ":"):
                return line.split()[1]
    except FileNotFoundError:
        return None

def zombies():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                found.append(int(entry))
    return found

def our_zombies():
    return [pid for pid in zombies() if proc_field(pid, "PPid") == str(os.getpid())]

# A child that forks a grandchild and exits at once, orphaning it. The grandchild prints nothing
# more (its stdout and stderr go to /dev/null) and exits with argv[1] when its stdin closes.
DOUBLE_FORK = '''
import os, sys
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdin.read()
    os._exit(int(sys.argv[1]))
print(pid, flush=True)
os._exit(0)
'''
"""


def _run_script(tmp_path: Path, body: str, *, prefix: list[str] | None = None) -> dict[str, Any]:
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*(prefix or []), sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.stdout.strip(), f"rc={done.returncode}\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["returncode"] = done.returncode
    result["stderr"] = done.stderr
    return result


# --- exit codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("child", "received", "expected"),
    [
        (None, None, 0),
        (0, None, 0),
        (1, None, 1),
        (2, None, 2),
        (255, None, 255),
        (-signal.SIGKILL, None, 137),
        (-signal.SIGTERM, None, 143),
        (-signal.SIGSEGV, None, 139),
        (None, signal.SIGTERM, 143),
        (None, signal.SIGINT, 130),
        (0, signal.SIGTERM, 143),  # we were told to stop: that is the outcome
        (3, signal.SIGHUP, 129),
        (-signal.SIGKILL, signal.SIGQUIT, 131),
    ],
)
def test_exit_code_for(child: int | None, received: int | None, expected: int) -> None:
    assert exit_code_for(child, received) == expected


@pytest.mark.parametrize(("child", "received"), [(256, None), (-65, None), (None, 0), (0, 99)])
def test_exit_code_for_rejects_nonsense(child: int | None, received: int | None) -> None:
    with pytest.raises(ValueError, match=r"exit code|signal"):
        exit_code_for(child, received)


# --- PID 1 and subreaper -------------------------------------------------------------------------


def test_is_pid1_and_is_subreaper_read_the_truth() -> None:
    assert pid1.is_pid1() is (os.getpid() == 1)
    assert isinstance(pid1.is_subreaper(), bool)  # readable on Linux; True is tested below
    probe = "from cuzk_supervisor import pid1; print(pid1.is_pid1(), pid1.is_subreaper())"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.split() == ["False", "False"]  # a child is never PID 1; flag not inherited


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="child watchers are gone from 3.12 on")
async def test_reaper_refuses_a_child_watcher_that_reaps_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(asyncio, "get_child_watcher", asyncio.SafeChildWatcher)
    with pytest.raises(RuntimeError, match="SafeChildWatcher"):
        Reaper().start()


def test_subreaper_unavailable_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pid1, "_libc", lambda: None)
    with capture_logs() as logs:
        assert pid1.become_subreaper() is False
    assert pid1.is_subreaper() is None
    assert logs[0]["event"] == "pid1.subreaper_unavailable"
    assert "prctl" in logs[0]["reason"]

    class _RefusingLibc:
        def prctl(self, *args: object) -> int:
            ctypes.set_errno(1)  # EPERM, as a seccomp filter might answer
            return -1

    monkeypatch.setattr(pid1, "_libc", _RefusingLibc)
    with capture_logs() as logs:
        assert pid1.become_subreaper() is False
    assert logs[0]["errno"] == 1
    assert logs[0]["reason"] == os.strerror(1)


def test_subreaper_adopts_an_orphan_and_the_reaper_collects_it(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path,
        r"""
async def main():
    out = {"pid": os.getpid(), "before": pid1.is_subreaper()}
    out["became"] = pid1.become_subreaper()
    out["after"] = pid1.is_subreaper()
    reaper = Reaper()
    reaper.start()
    proc = await reaper.spawn(
        sys.executable, "-c", DOUBLE_FORK, "7",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    grandchild = int(await proc.stdout.readline())
    out["grandchild"] = grandchild
    out["intermediate_rc"] = await proc.wait()
    # Its parent is gone: the kernel hands it to the nearest subreaper, us.
    out["ppid"] = int(await until(lambda: proc_field(grandchild, "PPid")))
    proc.stdin.close()  # the grandchild exits 7
    await until(lambda: any(r.pid == grandchild for r in reaper.reaped))
    out["reaped"] = [[r.pid, r.returncode] for r in reaper.reaped]
    out["grandchild_in_proc"] = os.path.exists(f"/proc/{grandchild}")
    out["our_zombies"] = our_zombies()
    reaper.stop()
    print(json.dumps(out))

asyncio.run(main())
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["before"] is False
    assert result["became"] is True
    assert result["after"] is True
    assert result["intermediate_rc"] == 0  # owned: its status went to its own waiter
    assert result["ppid"] == result["pid"]
    assert result["reaped"] == [[result["grandchild"], 7]]
    assert result["grandchild_in_proc"] is False
    assert result["our_zombies"] == []


def test_reaper_does_not_steal_from_asyncio_waiters(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path,
        r"""
async def main():
    reaper = Reaper()
    reaper.start()
    code = "import os, sys; os._exit(int(sys.argv[1]))"
    # Children someone waits for, started at the same time as forgotten ones exit around them.
    owned = await asyncio.gather(
        *(reaper.spawn(sys.executable, "-c", code, str(10 + i)) for i in range(8))
    )
    forgotten = [subprocess.Popen([sys.executable, "-c", code, str(30 + i)]) for i in range(8)]
    with reaper.holding():  # the same, written out, around a plain create_subprocess_exec
        by_hand = await asyncio.create_subprocess_exec(sys.executable, "-c", code, "42")
        reaper.own(by_hand.pid)
    out = {"owned": [await p.wait() for p in owned], "by_hand": await by_hand.wait()}
    pids = {p.pid: 30 + i for i, p in enumerate(forgotten)}
    await until(lambda: pids.keys() <= {r.pid for r in reaper.reaped})
    out["forgotten_ok"] = all(pids[r.pid] == r.returncode for r in reaper.reaped)
    out["reaped_owned"] = [r.pid for r in reaper.reaped if r.pid not in pids]
    out["our_zombies"] = our_zombies()
    reaper.stop()
    print(json.dumps(out))

asyncio.run(main())
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["owned"] == list(range(10, 18))
    assert result["by_hand"] == 42
    assert result["forgotten_ok"] is True
    assert result["reaped_owned"] == []
    assert result["our_zombies"] == []
    assert "Unknown child process" not in result["stderr"]  # asyncio's warning when robbed


def test_an_owned_zombie_does_not_hide_other_exited_children(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path,
        r"""
def state(pid):
    return proc_field(pid, "State")

reaper = Reaper()  # not started: reap() is called by hand
code = "import os, sys; os._exit(int(sys.argv[1]))"
owned = subprocess.Popen([sys.executable, "-c", code, "3"])
reaper.own(owned.pid)
asyncio.run(until(lambda: state(owned.pid) == "Z"))
other = subprocess.Popen([sys.executable, "-c", code, "4"])
asyncio.run(until(lambda: state(other.pid) == "Z"))
first = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT).si_pid
got = reaper.reap()
out = {
    "owned_seen_first": first == owned.pid,
    "reaped": [[r.pid, r.returncode] for r in got],
    "other": other.pid,
    "owned_state": state(owned.pid),
    "owned_rc": owned.wait(),
    "again": [[r.pid, r.returncode] for r in reaper.reap()],
}
print(json.dumps(out))
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["owned_seen_first"] is True  # the case this test is about
    assert result["reaped"] == [[result["other"], 4]]
    assert result["owned_state"] == "Z"  # left for its waiter ...
    assert result["owned_rc"] == 3  # ... which gets the real status
    assert result["again"] == []


def test_reaping_waits_while_a_spawn_is_being_claimed(tmp_path: Path) -> None:
    result = _run_script(
        tmp_path,
        r"""
def state(pid):
    return proc_field(pid, "State")

async def main():
    reaper = Reaper()
    reaper.start()
    code = "import os, sys; os._exit(int(sys.argv[1]))"
    with reaper.holding():
        mine = subprocess.Popen([sys.executable, "-c", code, "6"])
        stray = subprocess.Popen([sys.executable, "-c", code, "9"])
        # Both exit before `mine` is claimed; SIGCHLD arrives meanwhile.
        await until(lambda: state(mine.pid) == "Z" and state(stray.pid) == "Z")
        during = reaper.reap()
        reaper.own(mine.pid)
    await until(lambda: reaper.reaped)  # the pass deferred by the hold runs when it ends
    out = {
        "during": during,
        "after": [[r.pid, r.returncode] for r in reaper.reaped],
        "stray": stray.pid,
        "mine_rc": mine.wait(),
    }
    reaper.stop()
    print(json.dumps(out))

asyncio.run(main())
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["during"] == []
    assert result["after"] == [[result["stray"], 9]]
    assert result["mine_rc"] == 6


def _unshare_works() -> str | None:
    try:
        probe = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except FileNotFoundError:
        return "unshare(1) is not installed"
    if probe.returncode != 0:
        return f"unshare --pid --fork --mount-proc is not permitted here: {probe.stderr.strip()}"
    return None


def test_as_pid1_in_a_new_pid_namespace(tmp_path: Path) -> None:
    if reason := _unshare_works():
        pytest.skip(reason)
    result = _run_script(
        tmp_path,
        r"""
async def main():
    out = {"is_pid1": pid1.is_pid1()}
    reaper = Reaper()
    reaper.start()
    # Not claimed and never waited for: the Reaper collects the intermediate child as well.
    proc = subprocess.Popen(
        [sys.executable, "-c", DOUBLE_FORK, "5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    grandchild = int(proc.stdout.readline())
    out["grandchild_ppid"] = int(await until(lambda: proc_field(grandchild, "PPid") == "1" and 1))
    proc.stdin.close()
    await until(lambda: {grandchild, proc.pid} <= {r.pid for r in reaper.reaped})
    out["reaped"] = sorted([r.pid, r.returncode] for r in reaper.reaped)
    out["expected"] = sorted([[proc.pid, 0], [grandchild, 5]])
    out["zombies"] = zombies()
    reaper.stop()
    print(json.dumps(out), flush=True)
    sys.exit(pid1.exit_code_for(5, None))

asyncio.run(main())
""",
        prefix=["unshare", "--pid", "--fork", "--mount-proc"],
    )
    assert result["is_pid1"] is True, result["stderr"]
    assert result["grandchild_ppid"] == 1
    assert result["reaped"] == result["expected"]
    assert result["zombies"] == []
    assert result["returncode"] == 5  # unshare passes PID 1's exit code on


# --- signal forwarding -------------------------------------------------------------------------

# Records the signal it gets in argv[1]; with argv[2], first starts a grandchild (same group)
# recording to argv[2]. Prints one line when its handlers are in place.
RECORDER = r"""
import os, signal, subprocess, sys

def record(signum, frame):
    with open(sys.argv[1], "w") as f:
        f.write(str(signum))
    os._exit(0)

ready = ""
if len(sys.argv) > 2:
    grandchild = subprocess.Popen([sys.executable, __file__, sys.argv[2]], stdout=subprocess.PIPE)
    ready = grandchild.stdout.readline().decode().strip()
signal.signal(signal.SIGTERM, record)
print(f"{os.getpid()} {ready}".strip(), flush=True)
while True:
    signal.pause()
"""


async def test_forwarder_sends_sigterm_to_the_child_group(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    child_file, grandchild_file = tmp_path / "child", tmp_path / "grandchild"
    child = subprocess.Popen(  # noqa: ASYNC220 - started and read before the loop matters
        [sys.executable, str(script), str(child_file), str(grandchild_file)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        child_pid, grandchild_pid = map(int, child.stdout.readline().split())
        assert child_pid == child.pid
        forwarder = pid1.SignalForwarder()
        forwarder.start()
        try:
            forwarder.add(child.pid)
            os.kill(os.getpid(), signal.SIGTERM)  # as `docker stop` would
            assert await asyncio.wait_for(forwarder.wait(), DEADLINE_S) == signal.SIGTERM
            assert _until(lambda: child_file.exists() and child_file.read_text()) == "15"
            assert _until(lambda: grandchild_file.exists() and grandchild_file.read_text()) == "15"
            _until(lambda: _gone(child.pid) and _gone(grandchild_pid))
            os.kill(os.getpid(), signal.SIGINT)  # a later signal is forwarded, not recorded
            await asyncio.sleep(0)  # let the loop run the handler
        finally:
            forwarder.stop()
        assert forwarder.received == signal.SIGTERM
        assert exit_code_for(None, forwarder.received) == 143
        assert child.wait(DEADLINE_S) == 0
    finally:
        kill_tree([child.pid], grace_s=0.1)
        child.wait()


async def test_forwarder_signals_only_the_child_when_it_shares_our_group(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    child = subprocess.Popen(  # noqa: ASYNC220 - started and read before the loop matters
        [sys.executable, str(script), str(tmp_path / "child")], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()
        forwarder = pid1.SignalForwarder(signals=[signal.SIGHUP], terminating=[])
        forwarder.start()
        try:
            forwarder.add(child.pid)
            forwarder.forward(signal.SIGTERM)  # a killpg here would hit pytest itself
        finally:
            forwarder.stop()
        assert child.wait(DEADLINE_S) == 0
        assert (tmp_path / "child").read_text() == "15"
        assert forwarder.received is None
    finally:
        kill_tree([child.pid], grace_s=0.1)
        child.wait()


# --- kill_tree -----------------------------------------------------------------------------------

# argv[1]: root | obey | ignore | orphan-maker. Each prints its pid once it is ready.
TREE = r"""
import json, os, signal, subprocess, sys

def start(role):
    child = subprocess.Popen([sys.executable, __file__, role], stdout=subprocess.PIPE)
    return child, int(child.stdout.readline())

role = sys.argv[1]
if role == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if role == "root":
    _, obey = start("obey")
    _, ignore = start("ignore")
    maker, orphan = start("orphan-maker")
    maker.wait()  # the orphan's parent is gone: only the process group still finds it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only now: children inherit SIG_IGN
    print(json.dumps({"obey": obey, "ignore": ignore, "orphan": orphan}), flush=True)
elif role == "orphan-maker":
    _, orphan = start("obey")
    print(orphan, flush=True)
    sys.exit(0)
else:
    print(os.getpid(), flush=True)
while True:
    signal.pause()
"""


def _start_tree(tmp_path: Path, root_role: str = "root") -> tuple[subprocess.Popen[bytes], dict]:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    root = subprocess.Popen(
        [sys.executable, str(script), root_role], stdout=subprocess.PIPE, start_new_session=True
    )
    assert root.stdout is not None
    return root, json.loads(root.stdout.readline())


def test_kill_tree_sigkills_what_ignores_sigterm(tmp_path: Path) -> None:
    root, pids = _start_tree(tmp_path)
    try:
        assert psutil.Process(pids["orphan"]).ppid() != root.pid  # re-parented away
        report = kill_tree([root.pid], grace_s=0.3)
        assert set(report.killed) == {root.pid, pids["ignore"]}
        assert {pids["obey"], pids["orphan"]} <= set(report.terminated)
        assert report.survivors == ()
        for pid in (root.pid, *pids.values()):
            assert _gone(pid), pid  # exited when kill_tree returns: no waiting needed
        assert root.wait(DEADLINE_S) == -signal.SIGKILL  # the status was left for its waiter
    finally:
        kill_tree([root.pid], grace_s=0.1)
        root.wait()


def test_kill_tree_stops_an_obedient_tree_with_sigterm_alone(tmp_path: Path) -> None:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    root = subprocess.Popen(
        [sys.executable, str(script), "orphan-maker"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert root.stdout is not None
        orphan = int(root.stdout.readline())
        assert root.wait(DEADLINE_S) == 0  # its root already exited: found through the group
        report = kill_tree([root.pid], grace_s=DEADLINE_S)
        assert report.terminated == (orphan,)
        assert report.killed == ()
        _until(lambda: _gone(orphan))
    finally:
        kill_tree([root.pid], grace_s=0.1)


def test_kill_tree_spares_itself_its_ancestors_and_its_group(tmp_path: Path) -> None:
    # Run two levels down so that a mistake kills a throwaway parent, not pytest.
    result = _run_script(
        tmp_path,
        r"""
code = (
    "import os; from cuzk_supervisor.killtree import kill_tree; "
    "print(kill_tree([os.getpid(), os.getppid(), os.getpgrp()], grace_s=0.1) == "
    "kill_tree([], grace_s=0.1))"
)
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print(json.dumps({"child": child.stdout.strip(), "rc": child.returncode, "err": child.stderr}))
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["rc"] == 0, result["err"]
    assert result["child"].splitlines()[-1] == "True"  # after the log lines


# --- each event once (issue 14.7) ----------------------------------------------------------------


def test_kill_tree_of_a_tree_already_gone_says_nothing(tmp_path: Path) -> None:
    """After a clean daemon exit its group is empty: ``pid1.tree_stopped terminated=0`` was logged
    for it (three times at the end of a demo). Only a tree that had something to stop speaks."""
    done = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert done.returncode == 0
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    with capture_logs() as logs:
        assert kill_tree([], grace_s=0.1).terminated == ()
        root = subprocess.Popen(
            [sys.executable, str(script), "orphan-maker"],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert root.stdout is not None
        orphan = int(root.stdout.readline())
        root.wait(DEADLINE_S)
        report = kill_tree([root.pid], grace_s=DEADLINE_S)
        _until(lambda: _gone(orphan))
        assert kill_tree([root.pid], grace_s=0.1).terminated == ()  # nothing left: silent
    assert report.terminated == (orphan,)
    assert [(e["event"], e["terminated"]) for e in logs] == [("pid1.tree_stopped", 1)]


def test_one_orphan_is_one_event_and_a_kept_child_is_left_to_its_starter(tmp_path: Path) -> None:
    """An orphan's exit was logged as both ``pid1.reaped`` and ``pid1.orphan_reaped``; a child
    started before the runtime (``sim``'s manager) was killed and reaped by its last cleanup,
    its status stolen from its starter."""
    result = _run_script(
        tmp_path,
        r"""
from structlog.testing import capture_logs
from cuzk_supervisor.runtime import run_supervised

kept = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
                        stdin=subprocess.PIPE, start_new_session=True)
out = {}

async def body(rt):
    proc = await rt.reaper.spawn(
        sys.executable, "-c", DOUBLE_FORK, "7",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    grandchild = int(await proc.stdout.readline())
    out["grandchild"] = grandchild
    await proc.wait()
    await until(lambda: proc_field(grandchild, "PPid") == str(os.getpid()))
    proc.stdin.close()  # the grandchild exits 7
    await until(lambda: any(r.pid == grandchild for r in rt.reaper.reaped))
    return 0

with capture_logs() as logs:
    out["code"] = run_supervised(body, cleanup_grace_s=1.0, keep_children=[kept.pid])
out["kept_alive"] = kept.poll() is None
kept.stdin.close()
out["kept_rc"] = kept.wait(10)
out["events"] = [[e["event"], e.get("pid")] for e in logs if e["event"].startswith("pid1.")]
print(json.dumps(out))
""",
    )
    assert result["returncode"] == 0, result["stderr"]
    assert result["code"] == 0
    reaped = [pid for event, pid in result["events"] if "reaped" in event]
    assert reaped == [result["grandchild"]]  # one event for one exit
    assert ["pid1.orphan_reaped", result["grandchild"]] in result["events"]
    assert not any(event == "pid1.tree_stopped" for event, _ in result["events"])
    assert result["kept_alive"] is True
    assert result["kept_rc"] == 3  # its own status, for its own waiter
