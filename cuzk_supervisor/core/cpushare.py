"""The CPU's busy share against what this container may really use (issue 33).

A machine's busy share from ``psutil.cpu_percent`` is the host's logical CPUs: in a container
held to a quota of 16 CPUs on a 128-thread host it reads 12 % while the container is at its
limit, and on a host with hyperthreads it reads about half when every physical core is busy
(synthesis saturates the cores, not the threads). So the share is the CPU time the container
used over the capacity it has: its quota (``cpu.max``, or the CFS quota over its period) and the
physical cores of the CPUs it may run on, whichever is smaller. Pure arithmetic.
"""

from __future__ import annotations

import math


def capacity(quota_cpus: float | None, allowed_cpus: int, threads_per_core: float) -> float:
    """CPUs' worth of work the container can do at once: its quota, and the physical cores
    under the logical CPUs it may use (``allowed_cpus`` / ``threads_per_core``)."""
    cores = max(1.0, allowed_cpus / max(1.0, threads_per_core))
    if quota_cpus is not None and quota_cpus > 0:
        return min(quota_cpus, cores)
    return cores


def busy_share(used_cpu_s: float, wall_s: float, cpus: float) -> float | None:
    """CPU seconds used over ``wall_s`` seconds against ``cpus``, at most 1; None if unknown."""
    if wall_s <= 0 or cpus <= 0 or used_cpu_s < 0 or not math.isfinite(used_cpu_s):
        return None
    return min(1.0, used_cpu_s / (wall_s * cpus))


def quota_from_cpu_max(text: str | None) -> float | None:
    """cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``): CPUs, None unlimited."""
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def quota_from_cfs(quota_us: int | None, period_us: int | None) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    if quota_us is None or period_us is None or quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us
