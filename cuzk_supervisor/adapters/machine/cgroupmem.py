"""Reading a memory cgroup (v1 or v2): its limit (the lowest on the path), usage, working set,
page cache, OOM counters and, on v2, its PSI. Pure functions turn the files' text into a
:class:`CgroupMemory`; :class:`CgroupReader` resolves the file paths once and reads them on every
sample; :func:`read_oom_kill_count` reads the one counter the daemon's exit classification needs.
Why the cgroup: see :mod:`cuzk_supervisor.adapters.machine.resources`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.adapters.machine.cgroupfind import CgroupLocation, CgroupVersion
from cuzk_supervisor.adapters.machine.kernelfiles import (
    KernelFile,
    parse_int,
    parse_keyed,
    read_text,
)
from cuzk_supervisor.adapters.machine.psi import Psi, parse_psi

# A limit at or above 2**60 bytes (1 EiB) means "no limit". cgroup v1 writes "unlimited" as
# LONG_MAX rounded down to a page (9223372036854771712); some kernels and runtimes write other
# huge values (LONG_MAX, 2**63 - 1 rounded differently). No real machine has 1 EiB of RAM, so a
# fixed threshold is simpler and steadier than a rule relative to host RAM.
UNLIMITED_THRESHOLD = 1 << 60


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """One reading of a memory cgroup; every field is None where the file or key is absent."""

    version: CgroupVersion
    limit: int | None  # effective: the lowest limit on the path (v2 walk, v1 hierarchical)
    usage: int | None
    inactive_file: int | None
    file: int | None  # page cache (v2 ``file``, v1 ``total_cache``)
    working_set: int | None  # usage - inactive_file, what the kernel OOM logic and kubelet use
    oom: int | None  # v2 only: times the limit was hit and the OOM path ran
    oom_kill: int | None
    under_oom: bool | None  # v1 only
    psi: Psi | None  # v2 only (v1 has no per-cgroup PSI)


def parse_limit(text: str | None) -> int | None:
    """A limit file (``memory.max``, ``memory.limit_in_bytes``): None for ``max``, for huge
    values (>= ``UNLIMITED_THRESHOLD``), for anything that is not a number, and for no file."""
    return _limit_value(parse_int(text))


def cgroup_memory_v2(
    limits: Iterable[str | None],
    current: str | None,
    stat: str | None,
    events: str | None,
    pressure: str | None,
) -> CgroupMemory:
    """v2 files to values. ``limits`` are the ``memory.max`` texts of the cgroup and its
    ancestors: the effective limit is their minimum (a parent's limit binds its children)."""
    found = [v for v in map(parse_limit, limits) if v is not None]
    usage = parse_int(current)
    st = parse_keyed(stat, ("inactive_file", "file"))
    ev = parse_keyed(events, ("oom", "oom_kill"))
    inactive = st.get("inactive_file")
    return CgroupMemory(
        version=2,
        limit=min(found) if found else None,
        usage=usage,
        inactive_file=inactive,
        file=st.get("file"),
        working_set=working_set(usage, inactive),
        oom=ev.get("oom"),
        oom_kill=ev.get("oom_kill"),
        under_oom=None,
        psi=parse_psi(pressure),
    )


_V1_STAT_KEYS = (
    "total_inactive_file",
    "inactive_file",
    "total_cache",
    "cache",
    "hierarchical_memory_limit",
)


def cgroup_memory_v1(
    limit: str | None, usage: str | None, stat: str | None, oom_control: str | None
) -> CgroupMemory:
    """v1 files to values. The ``total_*`` stat keys include child cgroups (like ``usage``);
    ``hierarchical_memory_limit`` is the lowest limit up the tree, so no walk is needed."""
    st = parse_keyed(stat, _V1_STAT_KEYS)
    oc = parse_keyed(oom_control, ("oom_kill", "under_oom"))
    both = (parse_limit(limit), _limit_value(st.get("hierarchical_memory_limit")))
    limits = [v for v in both if v is not None]
    used = parse_int(usage)
    inactive = st.get("total_inactive_file", st.get("inactive_file"))
    under = oc.get("under_oom")
    return CgroupMemory(
        version=1,
        limit=min(limits) if limits else None,
        usage=used,
        inactive_file=inactive,
        file=st.get("total_cache", st.get("cache")),
        working_set=working_set(used, inactive),
        oom=None,
        oom_kill=oc.get("oom_kill"),
        under_oom=None if under is None else under != 0,
        psi=None,
    )


def _limit_value(value: int | None) -> int | None:
    return None if value is None or value >= UNLIMITED_THRESHOLD or value < 0 else value


def working_set(usage: int | None, inactive_file: int | None) -> int | None:
    """usage - inactive_file, floored at 0 (the counters are read at slightly different times).
    With no inactive_file figure, the whole usage (the cautious answer)."""
    if usage is None:
        return None
    return max(0, usage - (inactive_file or 0))


def _counter(path: Path, key: str) -> int | None:
    return parse_keyed(read_text(path), (key,)).get(key)


def read_oom_kill_count(cgroup_dir: Path) -> int | None:
    """The memory cgroup's ``oom_kill`` counter: v2 ``memory.events``, else v1
    ``memory.oom_control``; None when neither file has it (no cgroup, or an old kernel)."""
    for name in ("memory.events", "memory.oom_control"):
        count = _counter(cgroup_dir / name, "oom_kill")
        if count is not None:
            return count
    return None


class CgroupReader:
    """File paths resolved once, each file kept open (:class:`KernelFile`), read on every
    sample; the files that change seldom (the limits, the OOM counters) at most every
    ``slow_every_s`` (0: at every read), their last texts standing in between.

    The memory policy reads usage and working set at every sample; a limit is set once for a
    container's life, and the OOM counters are only the sample's record (the daemon's exit is
    classified from a fresh :func:`read_oom_kill_count`). On v1 the binding limit is read at every
    sample anyway (``hierarchical_memory_limit`` in ``memory.stat``). Each file read costs as
    much as parsing the others on an idle machine (issue 35).
    """

    def __init__(
        self,
        loc: CgroupLocation,
        *,
        slow_every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location = loc
        d = loc.dir
        self._version = loc.version
        self._slow_every_s = slow_every_s
        self._clock = clock
        self._slow_at = -math.inf
        if loc.version == 2:
            # The cgroup itself, then each ancestor up to and including the mount point.
            chain = [d, *[p for p in d.parents if _is_within(p, loc.mount)]]
            self._slow = [
                KernelFile(d / "memory.events"),
                *(KernelFile(p / "memory.max") for p in chain),
            ]
            self._fast = [
                KernelFile(d / n) for n in ("memory.current", "memory.stat", "memory.pressure")
            ]
        else:
            self._slow = [
                KernelFile(d / n) for n in ("memory.limit_in_bytes", "memory.oom_control")
            ]
            self._fast = [KernelFile(d / n) for n in ("memory.usage_in_bytes", "memory.stat")]
        self._slow_texts: list[str | None] = []

    def read(self) -> CgroupMemory:
        now = self._clock()
        if now - self._slow_at >= self._slow_every_s:
            self._slow_texts = [f.read() for f in self._slow]
            self._slow_at = now
        slow = self._slow_texts
        fast = [f.read() for f in self._fast]
        if self._version == 2:
            current, stat, pressure = fast
            return cgroup_memory_v2(slow[1:], current, stat, slow[0], pressure)
        usage, stat = fast
        limit, oom_control = slow
        return cgroup_memory_v1(limit, usage, stat, oom_control)


def _is_within(path: Path, top: Path) -> bool:
    return path == top or top in path.parents
