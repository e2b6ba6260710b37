"""The race search of issue 46: SIGKILL a supervisor's params phase at random moments, start the
next one at once on the same folder and state, and let the fetch itself say whether it ever
wrote beside another.

Run by tests/test_params_killsearch.py as a script of its own (``python tests/killsearch.py
SPEC``): it imports the package once and forks each supervisor from there (a Python start per
kill would make 200 kills take minutes). A supervisor is ``ensure_params`` in a forked child, as
the lifecycle runs it; the fetch is :data:`WRITER`, which writes its files in chunks, one of them
from a forked helper that escaped into a session of its own (``setsid``, the lock's descriptor
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
import collections
import json
import os
import random
import select
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog

from cuzk_supervisor.adapters.params import ExpectedFile, ParamsFailed, ensure_params

MARK = "killsearch-fetch"
"""In every fetch process's command line (the writer's file name)."""

WRITER = """
import os, sys, time
me = sys.argv[0]
journal, pause, chunks, specs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
instance = str(os.getpid())
def note(text):
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (text + "\\n").encode())
    os.close(fd)
def others():
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == instance:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\\0")
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[2:3] == [me.encode()] and state != "Z":  # python -S WRITER ...
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
seen = others()
if seen:
    note("overlap %s %s" % (instance, " ".join(seen)))
note("begin " + instance)
helper = os.fork()
if helper == 0:  # escapes into a session of its own, the lock's descriptor with it
    os.setsid()
    write(specs[1])
    os._exit(0)
write(specs[0])
if os.waitpid(helper, 0)[1] != 0:
    sys.exit(1)
note("end " + instance)
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
    pause_s: float = 0.01
    chunks: int = 16
    lock_wait_s: float = 60.0
    deadline_s: float = 600.0


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


PRESENT = 10
"""A supervisor's exit code here when it found the files whole (a leftover had finished them)."""


def _supervise(spec: Spec) -> int:
    """One supervisor's params phase, in a forked child: 0 (fetched), :data:`PRESENT`, 8
    (ParamsFailed) or 1."""
    writer = Path(spec.journal).with_name(f"{MARK}.py")
    specs = " ".join(f"{name}:{size}" for name, size in spec.sizes.items())
    command = (
        f"exec {sys.executable} -S {writer} {spec.journal} {spec.pause_s} {spec.chunks} {specs}"
    )
    expected = [ExpectedFile(name, size) for name, size in spec.sizes.items()]
    structlog.configure(processors=[
        structlog.processors.TimeStamper(fmt="%H:%M:%S.%f"),
        lambda _, __, event: {**event, "pid": os.getpid()},
        structlog.dev.ConsoleRenderer(colors=False),
    ])  # fmt: skip
    try:
        phase = ensure_params(
            Path(spec.folder), expected, command, timeout_s=120, progress_interval_s=5,
            stop_grace_s=2, pidfile=Path(spec.pidfile), lock_wait_s=spec.lock_wait_s,
        )  # fmt: skip
        outcome = asyncio.run(phase)
    except ParamsFailed as exc:
        print(f"PARAMS FAILED {exc}", flush=True)
        return 8
    return 0 if outcome.fetched else PRESENT


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


def _collect(pids: list[int]) -> None:
    for pid in pids:
        os.waitpid(pid, 0)


def _note(spec: Spec, text: str) -> None:
    """A line of ours in the supervisors' log, between theirs."""
    with open(spec.log, "a") as log:
        log.write(f"{time.strftime('%H:%M:%S')} killsearch: {text}\n")


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
    # Whole runs first: it works at all, and how long the phase takes here and now.
    lengths: collections.deque[float] = collections.deque(maxlen=9)
    for _ in range(3):
        began = time.monotonic()
        summary.final_rc = _run_out(_fork(spec))
        lengths.append(time.monotonic() - began)
        if summary.final_rc != 0 or not _whole(spec):
            summary.failed.append(f"a whole run: exit {summary.final_rc}, whole {_whole(spec)}")
            return summary
        _fresh(spec)
    summary.baseline_s = round(sorted(lengths)[1], 3)
    # A killed supervisor is a zombie until its parent collects it: at once (before the next
    # starts), just after the next started, or only once the next one's fate is known (the
    # next one looks for leftovers while its predecessor is a zombie: issue 46's moment).
    before: list[int] = []
    after: list[int] = []
    later: list[int] = []
    while summary.kills < spec.kills and time.monotonic() - started < spec.deadline_s:
        _collect(before)
        pid = _fork(spec)
        _collect(after)
        before, after, later = later, [], []
        forked = time.monotonic()
        # Over the whole phase and a little past it, as long as a whole phase lasts just now.
        code = _exited_within(pid, rng.uniform(0, 1.2 * statistics.median(lengths)))
        _note(spec, f"supervisor {pid}: {'killed' if code is None else f'exit {code}'}")
        if code is None:
            os.kill(pid, signal.SIGKILL)
            rng.choice((before, after, later)).append(pid)
            summary.kills += 1
        elif code in (0, PRESENT):
            if code == 0:  # a whole phase, fetch included: how long the next may last
                lengths.append(time.monotonic() - forked)
            summary.completed += 1
            if not _whole(spec):
                summary.not_whole.append(summary.kills)
            _fresh(spec)
        else:
            summary.failed.append(f"after {summary.kills} kills: exit {code}")
    last = _fork(spec)
    _collect(before + after + later)
    code = _run_out(last)
    summary.final_rc = 0 if code == PRESENT else code
    if summary.final_rc == 0 and not _whole(spec):
        summary.not_whole.append(summary.kills)
    summary.elapsed_s = round(time.monotonic() - started, 1)
    return summary


if __name__ == "__main__":
    result = search(Spec(**json.loads(sys.argv[1])))
    print(json.dumps(asdict(result)), flush=True)
