"""How fast this machine is for the tests, measured once per test session: the pace that the
end-to-end tests' scaled time and the test deadlines adapt to, and the pytest worker count.

The end-to-end tests run the supervisor, the simulated daemon and the simulated manager as real
processes in scaled time: a simulated minute is a fraction of a real second, so the few
milliseconds of CPU the supervisor spends on each event are simulated seconds. The scales were
chosen on the reference machine below, at its worker count; on a machine with less CPU to give
each test (fewer or slower cores, a CPU quota, other work) the same scales leave the processes
too little real time per simulated second and the tests' rates, budgets and phases bend. So:

- ``make test`` runs ``python tests/pacehelpers.py`` once: it measures the machine (the cores it
  may use, their speed on a fixed piece of pure-Python work, and how much of them is left to it
  now: the CPU the rest of the machine takes and the cgroup's CPU quota) and prints the pytest
  worker count and the measurement, which ``make test`` hands to pytest in
  ``CUZK_TEST_MEASURED``; a session started without it (a plain ``pytest``) measures
  the same in ``conftest.py``;
- while the tests run, pytest's main process keeps the slowness current as other work on the
  machine comes and goes (loadhelpers.PaceWatch) in a file every worker reads at the start of
  each test (``CUZK_TEST_PACE_FILE``); a test keeps the value it started with;
- tests divide their simulated time scales by :func:`slowness` (``scaled``) and multiply the
  deadlines they wait with by it (``patient``): a slow machine runs the same tests later, not red.

``CUZK_TEST_SLOWNESS`` set by hand (e.g. ``3``) forces the value for the whole session. Nothing
here is a margin that a test asserts: the slowness only stretches how long a test is willing to
wait and how slowly its simulated time runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import loadhelpers
import psutil

SLOWNESS_ENV = "CUZK_TEST_SLOWNESS"
"""A slowness forced by hand for the whole session."""
MEASURED_ENV = "CUZK_TEST_MEASURED"
"""The measurement ``make test`` made (``Pace.encode``), so that pytest need not make it again."""
PACE_FILE_ENV = "CUZK_TEST_PACE_FILE"
"""The file the main process keeps the current slowness in."""
LOOP = 3_000_000
"""Additions in the probe's pure-Python loop (in a function: local variables)."""
REFERENCE_CPU_S = 0.07
"""The loop's CPU seconds on the reference machine, one copy on each of its 2 cores at once
(AMD EPYC VM, Python 3.11): 0.055-0.12 s over 60 rounds through the day, mostly 0.06-0.09; the
faster end is taken, so that a fast moment of the VM does not count as a faster machine."""
REFERENCE_CAPACITY = 2.0
"""The reference machine's capacity in reference cores: the machine the scales were set on."""
REFERENCE_WORKERS = 8
"""The pytest workers the suite runs with there (four per core)."""
TOLERATED = 1.25
"""How much less capacity than the reference's the tests already take in their stride: the
reference machine's own spread between runs and the load of the other work it was tuned under.
The slowness is the capacity's shortfall beyond that. (At 1.5 the whole suite in a cgroup of a
third of the reference machine ran at slowness 1.65, 5 workers, and one fault row's rate check
failed; at 2.5, 3 workers, it passed.)"""
MAX_SLOWNESS = 8.0
ROUNDS = 5
WATCH_S = 2.0
"""How long the measurement watches the rest of the machine's CPU (others' work is bursty)."""


@dataclass(frozen=True)
class Pace:
    """One measurement of the machine."""

    cores: int
    """CPUs this process may run on (its affinity)."""
    speed: float
    """CPU seconds of the loop here over the reference's: 2.0 is a core half as fast."""
    contention: float
    """The cores over what is left of them to this session (loadhelpers.contention): 1.0 is
    every core ours; a CPU quota of a third gives 3, other work taking half of them 2."""
    load: float
    """The 1-minute load average (reported; the probe's contention is what counts: the load
    average remembers a minute of this suite's own previous run)."""

    @property
    def capacity(self) -> float:
        """What the tests get here, in reference cores."""
        return self.cores / (self.speed * self.contention)

    @property
    def slowness(self) -> float:
        """How much less CPU than the reference machine there is, beyond what the tests take in
        their stride (``TOLERATED``); at least 1."""
        ratio = REFERENCE_CAPACITY / self.capacity / TOLERATED
        return min(max(round(ratio, 2), 1.0), MAX_SLOWNESS)

    @property
    def workers(self) -> int:
        return workers_for(self.slowness)

    def encode(self) -> str:
        return f"{self.cores},{self.speed:.4g},{self.contention:.4g},{self.load:.3g}"

    @classmethod
    def decode(cls, text: str) -> Pace:
        cores, speed, contention, load = text.split(",")
        return cls(int(cores), float(speed), float(contention), float(load))

    def with_contention(self, contention: float) -> Pace:
        """The same machine with what is left of it now (loadhelpers.PaceWatch)."""
        return dataclasses.replace(self, contention=max(contention, 1.0))

    def describe(self) -> str:
        return (
            f"{self.cores} cores at {1 / self.speed:.2f}x the reference's speed, "
            f"{1 / self.contention:.0%} of them ours now (load average {self.load:.1f}): "
            f"{self.capacity:.2f} reference cores of {REFERENCE_CAPACITY:g}"
        )


def workers_for(slowness: float) -> int:
    """Pytest workers: the reference's count, fewer in proportion to the slowness (each worker
    then gets about the CPU it gets on the reference machine), at least 2."""
    return max(2, min(REFERENCE_WORKERS, round(REFERENCE_WORKERS / slowness)))


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def _child() -> None:
    """One probe process: wait for the start byte, run the loop, print CPU and wall seconds."""
    sys.stdin.buffer.read(1)
    cpu, wall = time.process_time(), time.perf_counter()
    _loop(LOOP)
    print(f"{time.process_time() - cpu} {time.perf_counter() - wall}", flush=True)


def _round(cores: int) -> tuple[float, float]:
    """The loop on every core at once: (median CPU seconds, worst wall over CPU)."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(cores)
    ]
    for proc in procs:  # started together once every interpreter is up
        assert proc.stdin is not None
        proc.stdin.write("go")
        proc.stdin.close()
    results = []
    for proc in procs:
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        proc.wait()
        cpu, wall = (float(x) for x in out.split())
        results.append((max(cpu, 1e-6), wall))
    return statistics.median(c for c, _ in results), max(w / c for c, w in results)


def measure(rounds: int = ROUNDS, watch_s: float = WATCH_S) -> Pace:
    """Measure the machine now (about 2 s): the loop's CPU seconds on every core at once (the
    cores' speed), and over at least ``watch_s`` how much CPU the rest of the machine took and
    the CPU quota this process runs under (what is left of the cores: loadhelpers.contention,
    as the watcher computes it while the tests run)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(cores or 1, 1)
    me = psutil.Process()
    try:
        busy, ours, began = (
            loadhelpers.busy_seconds(),
            loadhelpers.tree_seconds(me),
            time.monotonic(),
        )
    except OSError:  # no /proc/stat: the loop's own wall over CPU seconds says it instead
        busy = None
    measured = [_round(cores) for _ in range(rounds)]
    cpu = statistics.median(c for c, _ in measured)
    if busy is None:
        contention = statistics.median(k for _, k in measured)
    else:
        time.sleep(max(0.0, began + watch_s - time.monotonic()))
        took = time.monotonic() - began
        others = (loadhelpers.busy_seconds() - busy) - (loadhelpers.tree_seconds(me) - ours)
        quota = loadhelpers.quota_cores()
        contention = loadhelpers.contention(cores, max(others, 0.0) / took, quota)
    return Pace(
        cores=cores,
        speed=cpu / REFERENCE_CPU_S,
        contention=max(contention, 1.0),
        load=os.getloadavg()[0],
    )


_frozen: float | None = None


def freeze(value: float | None) -> None:
    """The slowness every call returns until ``freeze(None)`` (conftest: one test's value)."""
    global _frozen
    _frozen = value


def current() -> float:
    """The slowness now: forced by hand, else the main process's file, else measured once."""
    given = os.environ.get(SLOWNESS_ENV)
    if given:
        return max(float(given), 1.0)
    path = os.environ.get(PACE_FILE_ENV)
    if path:
        with contextlib.suppress(OSError, ValueError):
            return max(float(Path(path).read_text()), 1.0)
    measured = os.environ.get(MEASURED_ENV)
    return Pace.decode(measured).slowness if measured else _measured().slowness


@cache
def _measured() -> Pace:
    return measure()


def slowness() -> float:
    """This test's slowness (the value it started with), or the session's now."""
    return current() if _frozen is None else _frozen


def scaled(time_scale: float) -> float:
    """A simulated time scale for this machine: the reference's divided by the slowness."""
    return time_scale / slowness()


def patient(seconds: float) -> float:
    """A deadline a test waits with, stretched by the slowness (it only matters on a hang)."""
    return seconds * slowness()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--make", action="store_true", help="print WORKERS SLOWNESS only")
    args = parser.parse_args()
    if args.child:
        _child()
        return
    given = os.environ.get(SLOWNESS_ENV)
    if args.make and given:  # forced by hand: no measurement
        forced = max(float(given), 1.0)
        print(f"{workers_for(forced)} {forced:g} - slowness given in {SLOWNESS_ENV}")
        return
    pace = measure()
    if args.make:  # for the Makefile: WORKERS SLOWNESS MEASUREMENT DESCRIPTION
        print(f"{pace.workers} {pace.slowness:g} {pace.encode()} {pace.describe()}")
        return
    print(pace.describe())
    print(f"slowness {pace.slowness:g}, pytest workers {pace.workers}")


if __name__ == "__main__":
    main()
