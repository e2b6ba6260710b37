"""The pace kept current while the tests run: other work on the machine comes and goes (on a
shared machine or CI runner another job's test suite can take most of the CPU for minutes),
and a pace measured once, before the tests, cannot know.

:class:`PaceWatch` runs in pytest's main process: every second it reads how much CPU the whole
machine used (``/proc/stat``) and how much this test session used (the main process and every
process under it, finished children included: ``/proc/PID/stat`` utime, stime, cutime,
cstime), and keeps a moving average of what the rest of the machine took. With the CPU quota
this session runs under (its cgroup's ``cpu.cfs_quota_us`` or ``cpu.max``), that gives how much
of the cores is left to it now, and so the slowness (``pacehelpers``), which it writes to a file
every worker reads at the start of each test (``CUZK_TEST_PACE_FILE``). A test keeps the value
it started with: its time scale and its deadlines agree with each other.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

HALF_LIFE_S = 5.0
"""How fast the average follows a change in the other work (half of a step in 5 s)."""
PERIOD_S = 1.0
MAX_CONTENTION = 20.0


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (everything but idle and iowait; steal, the
    hypervisor's, counts as busy: it is CPU this machine did not get)."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tree_seconds(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and everything under it, finished and reaped children included."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _cgroup_quota_v1(own: str) -> float | None:
    best: float | None = None
    path = Path("/sys/fs/cgroup/cpu") / own.lstrip("/")
    for folder in [path, *path.parents]:
        if not str(folder).startswith("/sys/fs/cgroup/cpu"):
            break
        with contextlib.suppress(OSError, ValueError):
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
            if quota > 0 and period > 0:
                best = min(best or float("inf"), quota / period)
    return best


def _cgroup_quota_v2(own: str) -> float | None:
    best: float | None = None
    path = Path("/sys/fs/cgroup") / own.lstrip("/")
    for folder in [path, *path.parents]:
        if not str(folder).startswith("/sys/fs/cgroup"):
            break
        with contextlib.suppress(OSError, ValueError):
            quota, period = (folder / "cpu.max").read_text().split()
            if quota != "max":
                best = min(best or float("inf"), int(quota) / int(period))
    return best


def quota_cores() -> float | None:
    """The CPU quota this process runs under, in cores (the tightest along its cgroup's path),
    or None where there is none or it cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, own = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return _cgroup_quota_v1(own)
    for line in lines:
        if line.startswith("0::"):
            return _cgroup_quota_v2(line[3:])
    return None


def contention(cores: int, others_cores: float, quota: float | None) -> float:
    """Wall over CPU seconds for this session's work: the cores over what is left to it, by the
    quota or by the rest of the machine's work, whichever leaves less."""
    left = cores - min(others_cores, cores * (1 - 1 / MAX_CONTENTION))
    if quota is not None:
        left = min(left, quota)
    return min(cores / max(left, 1e-6), MAX_CONTENTION)


class PaceWatch:
    """The moving average of the other work's CPU, and the slowness from it, in a thread.

    ``slowness_for(contention)`` turns a contention into the session's slowness (the probe's
    speed and cores, pacehelpers.Pace); ``path`` is where the current value is written."""

    def __init__(
        self, slowness_for: Callable[[float], float], cores: int, first: float, path: Path
    ) -> None:
        self._slowness_for = slowness_for
        self.cores = cores
        self.path = path
        self.quota = quota_cores()
        self.others_cores: float | None = None
        self.current = first
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pace-watch", daemon=True)
        self.write(first)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def write(self, slowness: float) -> None:
        """The value, replaced whole (a reader never sees half of it)."""
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False) as handle:
            handle.write(f"{slowness:g}\n")
        os.replace(handle.name, self.path)

    def _run(self) -> None:
        busy, ours, at = busy_seconds(), tree_seconds(self._root), time.monotonic()
        while not self._stop.wait(PERIOD_S):
            with contextlib.suppress(OSError):
                busy2, ours2, at2 = busy_seconds(), tree_seconds(self._root), time.monotonic()
                others = max(0.0, (busy2 - busy) - (ours2 - ours)) / max(at2 - at, 1e-3)
                busy, ours, at = busy2, ours2, at2
                weight = 0.5 ** (PERIOD_S / HALF_LIFE_S)
                previous = others if self.others_cores is None else self.others_cores
                self.others_cores = weight * previous + (1 - weight) * others
                now = contention(self.cores, self.others_cores, self.quota)
                self.current = self._slowness_for(now)
                self.write(self.current)
