"""The CPU's busy share for the bench's evidence, against what the container may use
(:mod:`cuzk_supervisor.core.cpushare`): the CPU time its cgroup used since the previous call
(v2 ``cpu.stat`` ``usage_usec``, v1 ``cpuacct.usage``) over the wall time and the capacity (the
quota in ``cpu.max`` or ``cpu.cfs_quota_us``, the physical cores of the CPUs it may run on).
Without a readable cgroup, the whole machine's CPU time (psutil) against its physical cores.
Every root is a parameter (tests feed fixture folders); the clock is injected.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from cuzk_supervisor.adapters.machine.cgroupfind import (
    CgroupLocation,
    CgroupVersion,
    discover_cgroup,
)
from cuzk_supervisor.adapters.machine.kernelfiles import parse_int, parse_keyed, read_text
from cuzk_supervisor.core import cpushare


def discover_cpu_cgroup(
    proc_root: Path = Path("/proc"), fs_root: Path = Path("/")
) -> CgroupLocation | None:
    """The cgroup whose CPU accounting holds this process: the unified one (v2), or the v1
    hierarchy with ``cpuacct``."""
    return discover_cgroup("cpuacct", proc_root, fs_root)


def _threads_per_core() -> float:
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    return max(1.0, logical / physical)


def _allowed_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return psutil.cpu_count(logical=True) or 1


class CpuMeter:
    """``meter()``: the busy share since the previous call (None on the first, or unknown)."""

    def __init__(
        self,
        cgroup: CgroupLocation | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        allowed_cpus: int | None = None,
        threads_per_core: float | None = None,
    ) -> None:
        self.cgroup = cgroup
        self._clock = clock
        allowed = allowed_cpus if allowed_cpus is not None else _allowed_cpus()
        per_core = threads_per_core if threads_per_core is not None else _threads_per_core()
        self.capacity = cpushare.capacity(self._quota(), allowed, per_core)
        self._last: tuple[float, float] | None = None

    def _quota(self) -> float | None:
        if self.cgroup is None:
            return None
        d = self.cgroup.dir
        if self.cgroup.version == 2:
            return cpushare.quota_from_cpu_max(read_text(d / "cpu.max"))
        return cpushare.quota_from_cfs(
            parse_int(read_text(d / "cpu.cfs_quota_us")),
            parse_int(read_text(d / "cpu.cfs_period_us")),
        )

    def used_cpu_s(self) -> float | None:
        """CPU seconds used so far: the cgroup's, else the machine's (psutil)."""
        if self.cgroup is not None:
            d = self.cgroup.dir
            if self.cgroup.version == 2:
                usec = parse_keyed(read_text(d / "cpu.stat"), ["usage_usec"]).get("usage_usec")
                return None if usec is None else usec / 1e6
            nsec = parse_int(read_text(d / "cpuacct.usage"))
            return None if nsec is None else nsec / 1e9
        try:
            times = psutil.cpu_times()
        except (OSError, psutil.Error):
            return None
        idle = times.idle + getattr(times, "iowait", 0.0)
        return sum(times) - idle

    def __call__(self) -> float | None:
        used, now = self.used_cpu_s(), self._clock()
        if used is None:
            self._last = None
            return None
        last, self._last = self._last, (used, now)
        if last is None:
            return None
        return cpushare.busy_share(used - last[0], now - last[1], self.capacity)


def meter_for(cgroup_root: Path | None, proc_root: Path = Path("/proc")) -> CpuMeter:
    """The meter of the settings' machine: ``cgroup_root`` pins the cgroup folder (v2 when it
    has ``cpu.stat``), else the cgroup found through ``proc_root``."""
    if cgroup_root is not None:
        version: CgroupVersion = 2 if (cgroup_root / "cpu.stat").exists() else 1
        return CpuMeter(CgroupLocation(version, cgroup_root, cgroup_root))
    return CpuMeter(discover_cpu_cgroup(proc_root))
