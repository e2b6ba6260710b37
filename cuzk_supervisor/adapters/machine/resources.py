"""Memory samplers that turn the machine into plain snapshot data: host RAM (psutil), the
supervisor's own memory cgroup (v1 or v2), PSI, and the daemon's process-tree RSS.

This module holds the snapshot (:class:`MemorySnapshot`, plain frozen data), the psutil edge
(:func:`read_host_memory`) and :class:`MemorySampler`, which discovers the cgroup once at
construction and then reads a handful of small files per sample. The readers it is built from:
:mod:`~cuzk_supervisor.adapters.machine.cgroupfind` (where the memory cgroup is),
:mod:`~cuzk_supervisor.adapters.machine.cgroupmem` (what it holds),
:mod:`~cuzk_supervisor.adapters.machine.psi` (pressure stall files),
:mod:`~cuzk_supervisor.adapters.machine.proctree` (the daemon tree's RSS) and
:mod:`~cuzk_supervisor.adapters.machine.kernelfiles`. Every root (``/proc``, the filesystem root the
cgroup mounts live under) is a parameter so tests feed fixture folders. GPUs live in
``cuzk_supervisor.adapters.machine.gpu``.

Why the cgroup and not only psutil: inside a container ``/proc/meminfo`` shows the host, while
the kernel OOM-kills at the cgroup limit (incident I4, DESIGN principle 8).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from cuzk_supervisor.adapters.machine.cgroupfind import (
    CgroupLocation,
    CgroupVersion,
    discover_memory_cgroup,
)
from cuzk_supervisor.adapters.machine.cgroupmem import CgroupReader
from cuzk_supervisor.adapters.machine.kernelfiles import read_text
from cuzk_supervisor.adapters.machine.proctree import ProcessTree
from cuzk_supervisor.adapters.machine.psi import Psi, parse_psi

PsiSource = Literal["cgroup", "system"]


# --------------------------------------------------------------------------------------------
# Snapshots (plain frozen data)


@dataclass(frozen=True, slots=True)
class HostMemory:
    """Host RAM as ``/proc/meminfo`` (psutil) reports it: the host, even inside a container."""

    total: int
    available: int
    used: int


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """Everything the memory policy looks at, in bytes. ``None`` means "not known here"."""

    timestamp: float
    host_total: int
    host_available: int
    host_used: int
    cgroup_version: CgroupVersion | None
    cgroup_limit: int | None
    cgroup_usage: int | None
    cgroup_working_set: int | None
    cgroup_inactive_file: int | None
    cgroup_file: int | None
    cgroup_oom: int | None
    cgroup_oom_kill: int | None
    cgroup_under_oom: bool | None
    psi_source: PsiSource | None
    psi_some_avg10: float | None
    psi_full_avg10: float | None
    psi: Psi | None
    daemon_pid: int | None
    daemon_rss: int | None  # whole tree; None when no daemon pid or it is gone
    daemon_processes: int

    @property
    def effective_limit(self) -> int:
        """The lower of host RAM and the cgroup limit."""
        if self.cgroup_limit is None:
            return self.host_total
        return min(self.host_total, self.cgroup_limit)

    @property
    def headroom(self) -> int:
        """Bytes that can still be used before the first wall: the host's available memory, or
        the cgroup's limit minus its working set when that is lower. Negative when over."""
        room = self.host_available
        if self.cgroup_limit is not None and self.cgroup_working_set is not None:
            room = min(room, self.cgroup_limit - self.cgroup_working_set)
        return room

    @property
    def headroom_fraction(self) -> float:
        limit = self.effective_limit
        return self.headroom / limit if limit > 0 else 0.0


def read_host_memory() -> HostMemory:
    vm = psutil.virtual_memory()
    return HostMemory(total=vm.total, available=vm.available, used=vm.used)


# --------------------------------------------------------------------------------------------
# The sampler


class MemorySampler:
    """Reads one ``MemorySnapshot``; built once, sampled often.

    ``proc_root`` and ``fs_root`` are where ``/proc`` and the cgroup mounts are read (fixture
    folders in tests). ``cgroup`` pins the cgroup folder (skipping discovery); with
    ``discover=False`` and no ``cgroup`` the sampler reports no cgroup. Discovery happens once,
    here: the supervisor does not move between cgroups. ``host`` is the psutil edge, ``tree``
    the daemon-tree reader, ``clock`` stamps snapshots (wall time by default, for logs).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        fs_root: Path = Path("/"),
        *,
        cgroup: CgroupLocation | None = None,
        discover: bool = True,
        host: Callable[[], HostMemory] = read_host_memory,
        tree: ProcessTree | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if cgroup is None and discover:
            cgroup = discover_memory_cgroup(proc_root, fs_root)
        self._cgroup = CgroupReader(cgroup) if cgroup is not None else None
        self._system_psi = str(proc_root / "pressure" / "memory")
        self._host = host
        self._tree = tree if tree is not None else ProcessTree(proc_root)
        self._clock = clock

    @property
    def cgroup(self) -> CgroupLocation | None:
        """The cgroup read on each sample (its ``dir`` is what ``read_oom_kill_count`` takes)."""
        return self._cgroup.location if self._cgroup is not None else None

    def sample(self, daemon_pid: int | None = None) -> MemorySnapshot:
        host = self._host()
        cg = self._cgroup.read() if self._cgroup is not None else None
        psi: Psi | None = cg.psi if cg is not None else None
        source: PsiSource | None = "cgroup" if psi is not None else None
        if psi is None:
            psi = parse_psi(read_text(self._system_psi))
            source = "system" if psi is not None else None
        tree = self._tree.rss(daemon_pid) if daemon_pid is not None else None
        return MemorySnapshot(
            timestamp=self._clock(),
            host_total=host.total,
            host_available=host.available,
            host_used=host.used,
            cgroup_version=cg.version if cg else None,
            cgroup_limit=cg.limit if cg else None,
            cgroup_usage=cg.usage if cg else None,
            cgroup_working_set=cg.working_set if cg else None,
            cgroup_inactive_file=cg.inactive_file if cg else None,
            cgroup_file=cg.file if cg else None,
            cgroup_oom=cg.oom if cg else None,
            cgroup_oom_kill=cg.oom_kill if cg else None,
            cgroup_under_oom=cg.under_oom if cg else None,
            psi_source=source,
            psi_some_avg10=psi.some_avg10 if psi else None,
            psi_full_avg10=psi.full_avg10 if psi else None,
            psi=psi,
            daemon_pid=daemon_pid,
            daemon_rss=tree.rss if tree else None,
            daemon_processes=tree.processes if tree else 0,
        )
