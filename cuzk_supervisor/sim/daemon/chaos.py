"""Carrying faults out: the imperative side of ``faults.py``.

The controller is asked at each checkpoint, fires what is due (one WARN line each, so tests
and humans see it), and does the process-level effects itself. ``fail`` is returned to the
engine (it ends a proof); ``never-ready``/``addr-in-use`` are returned to the daemon's bind;
``cancel`` is returned to the servicer (it answers that call CANCELLED).

Two disturbances of the field run beside the faults (issue 32): :class:`ConnectionChaos` resets
every client connection again and again at seeded random intervals (a flaky path, a proxy that
drops connections), and :class:`Throttle` makes synthesis slower once the daemon has completed
a number of proofs (a GPU or CPU reaching its power cap minutes into the work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cuzk_supervisor.sim.daemon import logfmt
from cuzk_supervisor.sim.daemon.transport import CallRules
from cuzk_supervisor.sim.faults import Checkpoint, FaultSpec, Point, is_due
from cuzk_supervisor.sim.machine import gpufaults
from cuzk_supervisor.sim.machine.gpustate import GpuState

TARGET = "cuzk_sim::fault"
MEMORY_EVENTS_KEYS = ("low", "high", "max", "oom", "oom_kill")


class HangGate:
    """After ``hang`` fires every call is accepted and never answered."""

    def __init__(self) -> None:
        self.hung = False

    async def hold(self) -> None:
        if self.hung:
            await asyncio.get_running_loop().create_future()  # never resolved


def _claim(marker: str) -> bool:
    """Create ``marker`` if it does not exist; True when this call created it."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def write_memory_current(cgroup_dir: Path, real_bytes: int) -> None:
    """Keep ``memory.current`` of a cgroup-like folder at what the simulated allocations really
    take, so a supervisor pointed at the folder watches them grow toward its ``memory.max``."""
    path = cgroup_dir / "memory.current"
    tmp = cgroup_dir / f".memory.current.{os.getpid()}.tmp"
    tmp.write_text(f"{real_bytes}\n")
    os.replace(tmp, path)


def bump_oom_events(cgroup_dir: Path) -> None:
    """Add 1 to ``oom`` and ``oom_kill`` in ``memory.events`` (created with the standard keys
    at 0 if missing), written atomically as the kernel's file would appear to a reader."""
    path = cgroup_dir / "memory.events"
    counts = dict.fromkeys(MEMORY_EVENTS_KEYS, 0)
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key and value.strip().isdigit():
                counts[key] = int(value)
    counts["oom"] += 1
    counts["oom_kill"] += 1
    tmp = path.with_name(f".memory.events.{os.getpid()}.tmp")
    with tmp.open("w") as fh:
        fh.write("".join(f"{k} {v}\n" for k, v in counts.items()))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


_GRANDCHILD = """
import os, sys, time
w, seconds = int(sys.argv[1]), float(sys.argv[2])
pid = os.fork()
if pid == 0:
    os.close(w)
    time.sleep(seconds)
    os._exit(0)
os.write(w, str(pid).encode())
os._exit(0)
"""


def spawn_grandchild(seconds: float) -> int:
    """Double-fork a grandchild in its own session that sleeps ``seconds``; returns its pid.

    Like a leaked helper, it keeps the daemon's stdin/stdout/stderr open, so a reader waiting
    for EOF on the daemon's stdout waits until the grandchild is gone.
    """
    read_fd, write_fd = os.pipe()
    try:
        # subprocess (not os.fork) because grpc's threads make forking this process unsafe.
        middle = subprocess.Popen(
            [sys.executable, "-S", "-c", _GRANDCHILD, str(write_fd), str(seconds)],
            pass_fds=(write_fd,),
            start_new_session=True,
        )
        os.close(write_fd)
        middle.wait()
        data = b""
        while chunk := os.read(read_fd, 64):
            data += chunk
    finally:
        os.close(read_fd)
    return int(data)


_FLOODER = """
import datetime as dt, os, sys, time
rate, parent, head, tail = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
out, start, written = sys.stdout.buffer, time.monotonic(), 0
while os.getppid() == parent:
    time.sleep(0.01)
    due = int(rate * (time.monotonic() - start)) - written
    if due <= 0:
        continue
    prefix = head + dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") + tail
    try:
        out.write("".join(f"{prefix}{n}\\n" for n in range(written, written + due)).encode())
        out.flush()
    except OSError:
        break
    written += due
"""


class Flooder:
    """Writes ``rate`` log lines per second into the daemon's own stdout, in one batch per tick,
    anchored to the start time so it catches up instead of drifting when a tick runs late.

    From a process beside the daemon (its child, sharing its stdout): the real daemon's logging
    does not slow its answers (issue 42), and a flood written by the simulator's own event loop
    would, making a client's measured rate depend on how loaded the machine is. The child ends
    when the daemon does (it watches its parent) or when the pipe's reader has gone."""

    def __init__(self, log: logfmt.DaemonLog, rate: int) -> None:
        self._log = log
        self._rate = rate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # One line's format, the timestamp and the counter left to the child (each tick's own
        # time, as the simulator's lines carry).
        mark = "\x00"
        line = logfmt.format_line("info", "cuzk_core::pipeline", "sim log flood", {"n": 0}, mark)
        head, tail = line[: -len("0\n")].split(mark)
        sys.stdout.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _FLOODER, str(self._rate), str(os.getpid()), head, tail]
        )


class ConnectionChaos:
    """Resets every proxied connection, then again after a seeded random pause of ``low_s`` to
    ``high_s`` real seconds, until the process ends (``--chaos-resets``)."""

    def __init__(
        self, drop: Callable[[], int], log: logfmt.DaemonLog, low_s: float, high_s: float, seed: int
    ) -> None:
        self._drop = drop
        self._log = log
        self._low_s, self._high_s = low_s, high_s
        self._rng = random.Random(seed)
        self.resets = 0
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def of(
        cls, args: argparse.Namespace, drop: Callable[[], int], log: logfmt.DaemonLog
    ) -> ConnectionChaos | None:
        """Started, as ``--chaos-resets``/``--chaos-seed`` ask (None without them)."""
        if not args.chaos_resets:
            return None
        low, high = parse_pair(args.chaos_resets, "--chaos-resets")
        chaos = cls(drop, log, low, high, args.chaos_seed)
        chaos.task = asyncio.get_running_loop().create_task(chaos._run())
        return chaos

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._rng.uniform(self._low_s, self._high_s))
            dropped = self._drop()
            self.resets += 1
            self._log.debug(TARGET, "chaos reset connections", connections=dropped, n=self.resets)


class Throttle:
    """Synthesis ``factor`` times slower from the moment the daemon has completed
    ``after_proofs`` proofs (``--throttle``): the partitions started from then on take longer."""

    def __init__(
        self, factor: float, after_proofs: int, slow: Callable[[float], None], log: logfmt.DaemonLog
    ) -> None:
        self.factor = factor
        self.after_proofs = after_proofs
        self._slow = slow
        self._log = log
        self.fired = False

    @classmethod
    def of(
        cls, args: argparse.Namespace, slow: Callable[[float], None], log: logfmt.DaemonLog
    ) -> Throttle | None:
        """As ``--throttle`` asks (None without it)."""
        if not args.throttle:
            return None
        factor, after = parse_pair(args.throttle, "--throttle")
        return cls(factor, int(after), slow, log)

    def check(self, completed: int) -> None:
        if self.fired or completed < self.after_proofs:
            return
        self.fired = True
        self._slow(self.factor)
        self._log.warn(TARGET, "sim throttle: synthesis slower", factor=self.factor,
                       after_proofs=completed)  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The daemon's ``--chaos-resets``, ``--chaos-seed`` and ``--throttle``."""
    p.add_argument(
        "--chaos-resets",
        default=os.environ.get("CUZK_SIM_CHAOS_RESETS") or None,
        metavar="LOW:HIGH",
        help="reset every client connection, again and again, after seeded random pauses of "
        "LOW to HIGH real seconds (a flaky path)",
    )
    p.add_argument(
        "--chaos-seed",
        type=int,
        default=int(os.environ.get("CUZK_SIM_CHAOS_SEED") or 0),
        metavar="N",
        help="seed of --chaos-resets' pauses",
    )
    p.add_argument(
        "--throttle",
        default=os.environ.get("CUZK_SIM_THROTTLE") or None,
        metavar="FACTOR:PROOFS",
        help="synthesis FACTOR times slower once this daemon has completed PROOFS proofs (a GPU "
        "or CPU reaching its power cap)",
    )


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with those arguments (None: nothing)."""
    checks = (
        ("--chaos-resets", args.chaos_resets, lambda a, b: 0 < a <= b),
        ("--throttle", args.throttle, lambda a, b: 0.01 <= a <= 1000 and b >= 0),
    )
    for flag, text, valid in checks:
        if not text:
            continue
        try:
            if not valid(*parse_pair(text, flag)):
                return f"{flag} {text} is out of range"
        except ValueError as exc:
            return str(exc)
    return None


def parse_pair(text: str, what: str) -> tuple[float, float]:
    """``A:B`` as two numbers (ValueError with ``what`` in it otherwise)."""
    first, sep, second = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        return float(first), float(second)
    except ValueError:
        raise ValueError(f"{what}: expected A:B, got {text!r}") from None


class FaultController:
    def __init__(
        self,
        specs: list[FaultSpec],
        log: logfmt.DaemonLog,
        *,
        proofs_completed: Callable[[], int],
        drop: Callable[[], int],
        gate: HangGate,
        cgroup_dir: Path | None,
        freeze: Callable[[float], int] | None = None,
        rules: CallRules | None = None,
        time_scale: float = 1.0,
        throttle: Throttle | None = None,
    ) -> None:
        self.specs = specs
        self.throttle = throttle
        self._fired = [0] * len(specs)
        self._log = log
        self._proofs_completed = proofs_completed
        self._drop = drop
        self._freeze = freeze
        self.rules = rules if rules is not None else CallRules()
        self._time_scale = time_scale
        self._gate = gate
        self._cgroup_dir = cgroup_dir
        self._started = 0.0
        self._floods: list[Flooder] = []
        self.gpus: GpuState | None = None  # the GPUs' condition (gpufaults.py; --gpu-dir)

    def start_clock(self) -> None:
        """Start counting ``after_s`` now, and wake up at each ``after_s`` deadline."""
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        for spec in self.specs:
            if spec.after_s is not None:
                loop.call_at(self._started + spec.after_s, self.check, "timer")

    def check(
        self,
        point: Point,
        *,
        partition: int | None = None,
        memory_gib: float = 0.0,
        call: str | None = None,
    ) -> list[FaultSpec]:
        """Fire every fault due at this checkpoint; returns those fired."""
        elapsed = asyncio.get_running_loop().time() - self._started if self._started else 0.0
        if point == "completed" and self.throttle is not None:
            self.throttle.check(self._proofs_completed())
        cp = Checkpoint(point, self._proofs_completed(), elapsed, partition, memory_gib, call)
        fired: list[FaultSpec] = []
        for i, spec in enumerate(self.specs):
            if spec.kind == "cancel" and any(f.kind == "cancel" for f in fired):
                continue  # one call is cut once: the next cancel waits for the next call
            if is_due(spec, self._fired[i], cp):
                if spec.once is not None and not _claim(spec.once):
                    continue  # already fired in an earlier life of the daemon
                self._fired[i] += 1
                fired.append(spec)
                self._log.warn(
                    TARGET, "sim fault firing", fault=spec.text, point=point, count=self._fired[i]
                )
                self._act(spec)
        return fired

    def _act(self, spec: FaultSpec) -> None:
        kind = spec.kind
        if kind == "drop":
            self._log.warn(TARGET, "dropped client connections", connections=self._drop())
        elif kind == "freeze":
            window_s = spec.number / self._time_scale
            frozen = self._freeze(window_s) if self._freeze is not None else 0
            self._log.warn(
                TARGET, "froze client connections", connections=frozen, window_s=round(window_s, 3)
            )
        elif kind == "cancel-early":
            self.rules.deadline_lead_s = spec.number
        elif kind == "hang":
            self._gate.hung = True
        elif kind == "exit":
            os._exit(int(spec.number))
        elif kind == "oom":
            # Like the kernel's OOM killer: the counters move, then SIGKILL, no last words.
            if self._cgroup_dir is not None:
                bump_oom_events(self._cgroup_dir)
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "flood":
            flooder = Flooder(self._log, int(spec.number))
            self._floods.append(flooder)
            flooder.start()
        elif kind == "ignore-sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif kind in gpufaults.GPU_FAULTS and self.gpus is not None:
            gpufaults.act(self.gpus, spec, self._log)
        elif kind == "fork-grandchild":
            pid = spawn_grandchild(spec.number)
            self._log.error(TARGET, "forked a grandchild, exiting", pid=pid, sleep_s=spec.number)
            os._exit(1)
