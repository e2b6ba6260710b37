"""Memory samplers that turn the machine into plain snapshot data: host RAM, the
supervisor's own memory cgroup (v1 or v2), PSI, and the daemon's process-tree RSS.

This module holds the snapshot (:class:`MemorySnapshot`, plain frozen data), the host's RAM
(:class:`HostMemoryReader`, ``/proc/meminfo``; psutil where that cannot say) and
:class:`MemorySampler`, which discovers the cgroup once at construction and then reads a handful
of small files per sample. It is built from the sibling readers ``cgroupfind`` (where the memory
cgroup is), ``cgroupmem`` (what it holds), ``psi``, ``proctree`` (the daemon tree's RSS) and
``kernelfiles``. Every root (``/proc``, the filesystem root the cgroup mounts live under) is a
parameter so tests feed fixture folders. GPUs live in ``gpu``.

Why the cgroup and not only psutil: inside a container ``/proc/meminfo`` shows the host, while
the kernel OOM-kills at the cgroup limit (incident I4, docs/architecture.md, rule 6).
"""

from __future__ import annotations

import os
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
from cuzk_supervisor.adapters.machine.kernelfiles import KernelFile
from cuzk_supervisor.adapters.machine.proctree import ProcessTree
from cuzk_supervisor.adapters.machine.psi import Psi, parse_psi

PsiSource = Literal["cgroup", "system"]

TREE_LISTING_S = 5.0
"""How often the sampler's tree walk lists ``/proc`` for the daemon's new descendants (between
listings it reads the stat files of the members it knows): a new child counts toward the tree's
RSS within this long. That RSS is the daemon's peak and the samples' log fields; the OOM risk is
read from the cgroup and the host, which count every process at every sample."""

CGROUP_SLOW_FILES_S = 10.0
"""How often the cgroup's limits and OOM counters are read again (``CgroupReader``): a limit
changed under a running container counts within this long (on v1 at once, through
``memory.stat``)."""

TREE_FULL_RESCAN_S = 300.0
"""How often the tree walk reads the parent of every pid again (``ProcessTree.full_rescan_s``):
only a pid recycled between two listings as a new child of the daemon's tree needs it, which
takes the kernel's whole pid space to wrap; the full read is a stat file per process of the
machine."""


# --- snapshots (plain frozen data) ----------------------------------------------------------


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
    return HostMemory(total=vm.total, available=vm.available, used=vm.total - vm.available)


class HostMemoryReader:
    """Host RAM from ``/proc/meminfo`` kept open (:class:`KernelFile`): ``MemTotal`` and
    ``MemAvailable``, psutil's ``total`` and ``available`` on kernels 3.14 and later, at a fifth
    of its cost (psutil parses all fifty lines at each call; this is read every memory sample:
    issue 35, the idle supervisor's CPU). ``used`` is ``total - available``, as in psutil 6.
    Without ``MemAvailable`` (or a file that does not parse) psutil answers, from the other lines.
    """

    def __init__(self, path: str | os.PathLike[str] = "/proc/meminfo") -> None:
        self._file = KernelFile(path)

    def __call__(self) -> HostMemory:
        found = _meminfo_kib(self._file.read())
        if found is None:
            return read_host_memory()
        total, available = found[0] * 1024, found[1] * 1024
        return HostMemory(total=total, available=available, used=total - available)


def _meminfo_kib(text: str | None) -> tuple[int, int] | None:
    """(``MemTotal``, ``MemAvailable``) in KiB, or None without both, with 0 available (psutil's
    sign of a kernel that does not fill it in) or more available than there is (psutil then
    takes ``MemFree``)."""
    if text is None:
        return None
    total = available = None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            total = _kib(line)
        elif line.startswith("MemAvailable:"):
            available = _kib(line)
            break  # MemTotal comes first
    if not total or not available or available > total:
        return None
    return total, available


def _kib(line: str) -> int | None:
    fields = line.split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


# --- the sampler ----------------------------------------------------------------------------


class MemorySampler:
    """Reads one ``MemorySnapshot``; built once, sampled often. ``cgroup`` pins the cgroup
    folder (skipping discovery); with ``discover=False`` and no ``cgroup``, no cgroup. Discovery
    happens once, here: the supervisor does not move between cgroups. ``host`` is the psutil
    edge, ``tree`` the daemon-tree reader, ``clock`` stamps snapshots (wall time, for logs).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        fs_root: Path = Path("/"),
        *,
        cgroup: CgroupLocation | None = None,
        discover: bool = True,
        host: Callable[[], HostMemory] | None = None,
        tree: ProcessTree | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if cgroup is None and discover:
            cgroup = discover_memory_cgroup(proc_root, fs_root)
        self._cgroup = (
            CgroupReader(cgroup, slow_every_s=CGROUP_SLOW_FILES_S) if cgroup is not None else None
        )
        self._system_psi = KernelFile(proc_root / "pressure" / "memory")
        self._host = host if host is not None else HostMemoryReader()
        if tree is None:
            tree = ProcessTree(
                proc_root, list_every_s=TREE_LISTING_S, full_rescan_s=TREE_FULL_RESCAN_S
            )
        self._tree = tree
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
            psi = parse_psi(self._system_psi.read())
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
