"""The race search of issue 46: SIGKILL a supervisor's params phase at random moments, start the
next one at once on the same folder and state, and let the fetch itself say whether it ever
wrote beside another.

Run by tests/test_params_killsearch.py as a script of its own (``python tests/killsearch.py
SPEC``): it imports the package once and forks each supervisor from there (a Python start per
kill would make 200 kills take minutes). A supervisor is ``ensure_params`` in a forked child, as
the lifecycle runs it; the fetch is :data:`WRITER`, which writes its files in chunks, one of them
from a helper that escaped into a session of its own with ``setsid`` (the lock's descriptor
inherited). Killed supervisors are collected only after their successor has started: the moment
issue 46's race hit (a killed supervisor still a zombie while its successor looks for leftovers).

The fetch keeps a journal (one ``write`` per line, ``O_APPEND``: whole lines in the order
written): ``begin I`` when instance ``I`` starts, after looking in ``/proc`` for any process of
another instance still alive (``overlap I PIDS`` if there is one: two fetches alive at once),
``w I`` for each chunk written, ``end I`` when done. :func:`violations` reads it.

Prints one JSON object: the seed, the kills, the completed runs and whether the files were
whole each time, the last supervisor's exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuzk_supervisor.adapters.params import ExpectedFile, ParamsFailed, ensure_params

MARK = "killsearch-fetch"
"""In every fetch process's command line (the writer's file name)."""

WRITER = """
import os, subprocess, sys, time
me = sys.argv[0]
journal, instance, pause, chunks = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
specs = sys.argv[5:]
if instance == "main":
    instance = str(os.getpid())
def note(text):
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (text + "\\n").encode())
    os.close(fd)
def instance_of(pid, argv):
    return pid if argv[2] == b"main" else argv[2].decode()
def others():
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\\0")[2:]  # python -S
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[:1] == [me.encode()] and state != "Z" and instance_of(pid, argv) != instance:
            alive.append(pid)
    return alive
def write(spec):
    name, _, size = spec.rpartition(":")
    size = int(size)
    data = (name.encode() * (size // len(name) + 1))[:size]
    step = -(-size // chunks)
    with open(name, "wb") as out:
        for start in range(0, size, step):
            out.write(data[start:start + step]); out.flush()
            note("w " + instance)
            time.sleep(pause)
if sys.argv[2] == "main":
    seen = others()
    if seen:
        note("overlap %s %s" % (instance, " ".join(seen)))
    note("begin " + instance)
    helper = subprocess.Popen(["setsid", sys.executable, "-S", me, journal, instance,
                               str(pause), str(chunks), specs[1]], close_fds=False)
    write(specs[0])
    if helper.wait() != 0:
        sys.exit(1)
    note("end " + instance)
else:
    write(specs[0])
"""


def content(name: str, size: int) -> bytes:
    return (name.encode() * (size // len(name) + 1))[:size]


def violations(lines: list[str]) -> list[str]:
    """Two fetches at once, as the journal shows them: an ``overlap`` line (another instance
    alive when one began), or a write by an instance after a later one began."""
    found: list[str] = []
    current: str | None = None
    for number, line in enumerate(lines, 1):
        kind, _, rest = line.partition(" ")
        instance = rest.split(" ")[0]
        if kind == "overlap":
            found.append(f"line {number}: {line}")
        elif kind == "begin":
            current = instance
        elif kind == "w" and instance != current:
            found.append(f"line {number}: {line} after instance {current} began")
    return found


@dataclass
class Spec:
    folder: str
    pidfile: str
    journal: str
    log: str
    seed: int
    kills: int
    sizes: dict[str, int]
    pause_s: float = 0.004
    chunks: int = 4
    lock_wait_s: float = 60.0


@dataclass
class Summary:
    seed: int
    baseline_s: float = 0.0
    kills: int = 0
    completed: int = 0
    not_whole: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    final_rc: int | None = None
    elapsed_s: float = 0.0


def _supervise(spec: Spec) -> int:
    """One supervisor's params phase, in a forked child: 0, 8 (ParamsFailed) or 1."""
    writer = Path(spec.journal).with_name(f"{MARK}.py")
    specs = " ".join(f"{name}:{size}" for name, size in spec.sizes.items())
    command = (
        f"exec {sys.executable} -S {writer} {spec.journal} main {spec.pause_s} {spec.chunks} "
        f"{specs}"
    )
    expected = [ExpectedFile(name, size) for name, size in spec.sizes.items()]
    try:
        phase = ensure_params(
            Path(spec.folder), expected, command, timeout_s=120, progress_interval_s=5,
            stop_grace_s=2, pidfile=Path(spec.pidfile), lock_wait_s=spec.lock_wait_s,
        )  # fmt: skip
        asyncio.run(phase)
    except ParamsFailed as exc:
        print(f"PARAMS FAILED {exc}", flush=True)
        return 8
    return 0


def _fork(spec: Spec) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(spec.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = _supervise(spec)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _run_out(pid: int) -> int | None:
    """A supervisor left to finish: its exit code (None: still running after 120 s, killed)."""
    code = _exited_within(pid, 120)
    if code is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return code


def _exited_within(pid: int, seconds: float) -> int | None:
    """The exit code if ``pid`` (our child) exits within ``seconds``; None while it runs. Waits
    on its pidfd: no sleep decides when it ended."""
    pidfd = os.pidfd_open(pid)
    try:
        select.select([pidfd], [], [], seconds)
    finally:
        os.close(pidfd)
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def _whole(spec: Spec) -> bool:
    folder = Path(spec.folder)
    try:
        return all((folder / n).read_bytes() == content(n, s) for n, s in spec.sizes.items())
    except OSError:
        return False


def _fresh(spec: Spec) -> None:
    """After a completed run: the files gone, so that the next supervisor fetches again."""
    for name in spec.sizes:
        (Path(spec.folder) / name).unlink(missing_ok=True)


def search(spec: Spec) -> Summary:
    Path(spec.journal).with_name(f"{MARK}.py").write_text(WRITER)
    rng = random.Random(spec.seed)
    summary = Summary(seed=spec.seed)
    started = time.monotonic()
    # One whole run first: it works at all, and how long the phase takes here and now.
    first = _fork(spec)
    summary.final_rc = _run_out(first)
    summary.baseline_s = round(time.monotonic() - started, 3)
    if summary.final_rc != 0 or not _whole(spec):
        summary.failed.append(f"the first run: exit {summary.final_rc}, whole {_whole(spec)}")
        return summary
    _fresh(spec)
    uncollected: list[int] = []
    while summary.kills < spec.kills and time.monotonic() - started < 600:
        pid = _fork(spec)
        for old in uncollected:  # the predecessor collected only now: a zombie until here
            os.waitpid(old, 0)
        uncollected = []
        code = _exited_within(pid, rng.uniform(0, 1.2 * summary.baseline_s))
        if code is None:
            os.kill(pid, signal.SIGKILL)
            uncollected.append(pid)
            summary.kills += 1
        elif code == 0:
            summary.completed += 1
            if not _whole(spec):
                summary.not_whole.append(summary.kills)
            _fresh(spec)
        else:
            summary.failed.append(f"after {summary.kills} kills: exit {code}")
    last = _fork(spec)
    for old in uncollected:
        os.waitpid(old, 0)
    summary.final_rc = _run_out(last)
    if summary.final_rc == 0 and not _whole(spec):
        summary.not_whole.append(summary.kills)
    summary.elapsed_s = round(time.monotonic() - started, 1)
    return summary


if __name__ == "__main__":
    result = search(Spec(**json.loads(sys.argv[1])))
    print(json.dumps(asdict(result)), flush=True)
