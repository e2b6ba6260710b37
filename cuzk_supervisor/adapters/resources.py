"""Memory samplers that turn the machine into plain snapshot data: host RAM (psutil), the
supervisor's own memory cgroup (v1 or v2), PSI, and the daemon's process-tree RSS.

Layout: pure parsers (text in, values out) first, then thin readers, then ``MemorySampler``,
which discovers the cgroup once at construction and then reads a handful of small files per
sample. Every root (``/proc``, the filesystem root the cgroup mounts live under) is a parameter
so tests feed fixture folders. GPUs live in ``cuzk_supervisor.adapters.gpu``.

Why the cgroup and not only psutil: inside a container ``/proc/meminfo`` shows the host, while
the kernel OOM-kills at the cgroup limit (incident I4, DESIGN principle 8).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import psutil

# A limit at or above 2**60 bytes (1 EiB) means "no limit". cgroup v1 writes "unlimited" as
# LONG_MAX rounded down to a page (9223372036854771712); some kernels and runtimes write other
# huge values (LONG_MAX, 2**63 - 1 rounded differently). No real machine has 1 EiB of RAM, so a
# fixed threshold is simpler and steadier than a rule relative to host RAM.
UNLIMITED_THRESHOLD = 1 << 60

CgroupVersion = Literal[1, 2]
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
class Psi:
    """One pressure-stall file (``some`` and ``full`` lines); avg in percent, total in µs.
    ``full`` is None where the kernel prints only ``some``."""

    some_avg10: float
    some_avg60: float
    some_total: int
    full_avg10: float | None = None
    full_avg60: float | None = None
    full_total: int | None = None


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where the memory cgroup lives: its folder and the hierarchy's mount point (the top of
    the ancestor walk). ``dir`` is a real path (already joined with the filesystem root)."""

    version: CgroupVersion
    dir: Path
    mount: Path


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


@dataclass(frozen=True, slots=True)
class TreeRss:
    rss: int
    processes: int


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


# --------------------------------------------------------------------------------------------
# Pure parsers


@dataclass(frozen=True, slots=True)
class CgroupLine:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-id:controllers:path``."""

    hierarchy_id: int
    controllers: tuple[str, ...]
    path: str


@dataclass(frozen=True, slots=True)
class Mount:
    """The fields of one ``/proc/<pid>/mountinfo`` line that cgroup discovery needs."""

    root: str  # the path inside the filesystem (the cgroup hierarchy) that is mounted
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


def parse_proc_cgroup(text: str) -> list[CgroupLine]:
    lines = []
    for raw in text.splitlines():
        ident, sep1, rest = raw.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2) or not ident.strip().isdigit():
            continue
        names = tuple(c for c in controllers.split(",") if c)
        lines.append(CgroupLine(int(ident), names, path))
    return lines


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Format (proc(5)): ``id parent maj:min root mountpoint opts [optional...] - fstype
    source superopts``; the optional fields vary, so split at the lone ``-``."""
    mounts = []
    for raw in text.splitlines():
        fields = raw.split()
        try:
            dash = fields.index("-", 6)
        except ValueError:
            continue
        tail = fields[dash + 1 :]
        if len(tail) < 2:
            continue
        supers = tuple(tail[2].split(",")) if len(tail) >= 3 else ()
        mounts.append(
            Mount(_unescape_mount(fields[3]), _unescape_mount(fields[4]), tail[0], supers)
        )
    return mounts


def _relative_to_root(path: str, root: str) -> PurePosixPath | None:
    """The cgroup ``path`` below the mount's ``root``, or None when it is not below it."""
    p, r = PurePosixPath(path), PurePosixPath(root)
    if p == r:
        return PurePosixPath(".")
    try:
        rel = p.relative_to(r)
    except ValueError:
        return None
    return None if ".." in rel.parts else rel


@dataclass(frozen=True, slots=True)
class CgroupPlace:
    """Pure result of discovery: which hierarchy, the mount point, and the cgroup folder, both
    as paths in the process's view of the filesystem (join with a root to read them)."""

    version: CgroupVersion
    mount_point: PurePosixPath
    dir: PurePosixPath


def find_memory_cgroup(
    cgroups: Iterable[CgroupLine], mounts: Iterable[Mount]
) -> CgroupPlace | None:
    """Locate the memory cgroup from ``/proc/self/cgroup`` and ``mountinfo``.

    A v1 hierarchy carrying the ``memory`` controller wins when it is listed and mounted (on a
    hybrid host the unified ``0::`` line exists too but has no memory controller). Otherwise the
    unified ``0::path`` line with a cgroup2 mount. The path is taken relative to the mount's
    root; with a cgroup namespace (containers) both are usually ``/``. A path that is not below
    any mount's root (a process moved out of its namespace's cgroup, shown as ``/..``) falls back
    to the mount point itself, the closest cgroup we can see.
    """
    cgroups, mounts = list(cgroups), list(mounts)
    v1 = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    for line in cgroups:
        if line.hierarchy_id != 0 and "memory" in line.controllers and v1:
            return _place(1, line.path, v1)
    for line in cgroups:
        if line.hierarchy_id == 0 and not line.controllers and v2:
            return _place(2, line.path, v2)
    return None


def _place(version: CgroupVersion, path: str, mounts: list[Mount]) -> CgroupPlace:
    # The same hierarchy can be mounted more than once; prefer the mount whose root is the
    # longest prefix of our path (the most specific view), then the first one.
    best: tuple[int, Mount, PurePosixPath] | None = None
    for m in mounts:
        rel = _relative_to_root(path, m.root)
        if rel is not None and (best is None or len(m.root) > best[0]):
            best = (len(m.root), m, rel)
    if best is None:
        mount_point = PurePosixPath(mounts[0].mount_point)
        return CgroupPlace(version, mount_point, mount_point)
    _, m, rel = best
    mount_point = PurePosixPath(m.mount_point)
    return CgroupPlace(version, mount_point, mount_point / rel)


def parse_limit(text: str | None) -> int | None:
    """A limit file (``memory.max``, ``memory.limit_in_bytes``): None for ``max``, for huge
    values (>= ``UNLIMITED_THRESHOLD``), for anything that is not a number, and for no file."""
    if text is None:
        return None
    value = parse_int(text)
    if value is None or value >= UNLIMITED_THRESHOLD or value < 0:
        return None
    return value


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None


def parse_keyed(text: str | None, keys: Iterable[str] | None = None) -> dict[str, int]:
    """``key value`` lines (``memory.stat``, ``memory.events``, ``memory.oom_control``) to a
    dict, keeping only ``keys`` when given; lines that do not parse are skipped."""
    if text is None:
        return {}
    wanted = None if keys is None else set(keys)
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if wanted is not None and name not in wanted:
            continue
        number = parse_int(value)
        if number is not None:
            out[name] = number
    return out


def parse_psi(text: str | None) -> Psi | None:
    """``some avg10=0.00 avg60=0.00 avg300=0.00 total=0`` (+ a ``full`` line); None for no file
    or no ``some`` line."""
    if text is None:
        return None
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        lines[kind] = dict(f.partition("=")[::2] for f in rest.split())
    try:
        some = lines["some"]
        some_vals = (float(some["avg10"]), float(some["avg60"]), int(some["total"]))
    except (KeyError, ValueError):
        return None
    full = lines.get("full")
    full_vals: tuple[float | None, float | None, int | None] = (None, None, None)
    if full is not None:
        with contextlib.suppress(KeyError, ValueError):
            full_vals = (float(full["avg10"]), float(full["avg60"]), int(full["total"]))
    return Psi(*some_vals, *full_vals)


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
    limits = [
        v
        for v in (parse_limit(limit), _limit_value(st.get("hierarchical_memory_limit")))
        if v is not None
    ]
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


# --------------------------------------------------------------------------------------------
# Readers (I/O)


def read_text(path: str | os.PathLike[str]) -> str | None:
    """A small kernel file, or None when absent or unreadable. Unbuffered binary read: cheaper
    than ``Path.read_text`` and these files are a few KiB at most."""
    try:
        with open(path, "rb", buffering=0) as f:
            return os.fsdecode(f.read())  # as the kernel wrote it (paths may not be ASCII)
    except OSError:
        return None


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


def _under(root: Path, path: PurePosixPath) -> Path:
    # Join an absolute path from /proc with a filesystem root (fixtures); "/" leaves it as is.
    return root / path.relative_to("/") if path.is_absolute() else root / path


def discover_memory_cgroup(
    proc_root: Path = Path("/proc"), fs_root: Path = Path("/"), pid: int | Literal["self"] = "self"
) -> CgroupLocation | None:
    """Find the memory cgroup of ``pid`` from ``<proc_root>/<pid>/cgroup`` and ``mountinfo``;
    mount points are read below ``fs_root``. None when there is no memory cgroup to read."""
    base = proc_root / str(pid)
    cgroup_text, mountinfo_text = read_text(base / "cgroup"), read_text(base / "mountinfo")
    if cgroup_text is None or mountinfo_text is None:
        return None
    place = find_memory_cgroup(parse_proc_cgroup(cgroup_text), parse_mountinfo(mountinfo_text))
    if place is None:
        return None
    return CgroupLocation(
        place.version, _under(fs_root, place.dir), _under(fs_root, place.mount_point)
    )


class _CgroupReader:
    """File paths resolved once (strings: cheapest to open), read on every sample."""

    def __init__(self, loc: CgroupLocation) -> None:
        self.location = loc
        d = loc.dir
        self._version = loc.version
        if loc.version == 2:
            # The cgroup itself, then each ancestor up to and including the mount point.
            chain = [d, *[p for p in d.parents if _is_within(p, loc.mount)]]
            self._limits = [str(p / "memory.max") for p in chain]
            self._files = [str(d / n) for n in _V2_FILES]
        else:
            self._limits = []
            self._files = [str(d / n) for n in _V1_FILES]

    def read(self) -> CgroupMemory:
        texts = [read_text(p) for p in self._files]
        if self._version == 2:
            return cgroup_memory_v2([read_text(p) for p in self._limits], *texts)
        return cgroup_memory_v1(*texts)


_V2_FILES = ("memory.current", "memory.stat", "memory.events", "memory.pressure")
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "memory.oom_control")


def _is_within(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def read_host_memory() -> HostMemory:
    vm = psutil.virtual_memory()
    return HostMemory(total=vm.total, available=vm.available, used=vm.used)


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the tree walk needs."""

    ppid: int
    state: str
    rss_pages: int


def parse_proc_stat(text: str | None) -> ProcStat | None:
    """``pid (comm) state ppid ... rss(24) ...``; ``comm`` may hold
    spaces and parentheses, so fields are counted from the last ``)``."""
    if text is None:
        return None
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 2 :].split()
    # fields[0] is field 3 (state), so field N is fields[N - 3].
    try:
        return ProcStat(ppid=int(fields[1]), state=fields[0], rss_pages=int(fields[21]))
    except (IndexError, ValueError):
        return None


class ProcessTree:
    """RSS of a process and all its descendants, read from ``<proc_root>/<pid>/stat``.

    Not psutil's ``children(recursive=True)``: that reads the stat file of every process on each
    call (1.3 ms of CPU for 90 processes on the development VM, where /proc reads cost ~8 µs
    each). Instead the parent of each pid is cached: a sample lists ``/proc`` (one getdents),
    reads the stat file of pids it has not seen before and of the tree's members (for their
    RSS). A member whose fresh parent is not in the tree (reparented, or a recycled pid) is
    dropped. A non-member's parent only changes by reparenting to a subreaper or init, which
    never puts it into the daemon's tree; the one case the cache can miss (a pid recycled
    between two samples as a new child of the tree) is bounded by a full re-read every
    ``full_rescan_s``.

    Processes that vanish mid-scan are skipped. RSS counts shared pages once per process (an
    upper bound, like summing ``ps`` RSS). Zombies hold no memory and are not counted.
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        *,
        page_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        full_rescan_s: float = 30.0,
    ) -> None:
        self._proc = str(proc_root)
        self._page = page_size or os.sysconf("SC_PAGE_SIZE")
        self._clock = clock
        self._full_rescan_s = full_rescan_s
        self._parents: dict[int, int] = {}  # pid -> ppid
        self._last_full = -math.inf

    def _stat(self, pid: int) -> ProcStat | None:
        return parse_proc_stat(read_text(f"{self._proc}/{pid}/stat"))

    def rss(self, root: int) -> TreeRss | None:
        """None when ``root`` is gone (or ``/proc`` cannot be listed)."""
        try:
            names = os.listdir(self._proc)
        except OSError:
            return None
        now = self._clock()
        if now - self._last_full >= self._full_rescan_s:
            self._parents.clear()
            self._last_full = now
        live = {int(n) for n in names if n.isdigit()}
        parents = self._parents
        for pid in parents.keys() - live:
            del parents[pid]
        for pid in live - parents.keys():
            st = self._stat(pid)
            if st is not None:  # gone already: skip
                parents[pid] = st.ppid
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)

        members: set[int] = set()
        total, count = 0, 0
        queue = [root]  # depth-first; a parent is always visited before its children
        while queue:
            pid = queue.pop()
            st = self._stat(pid)
            if st is None:  # exited since the listing
                parents.pop(pid, None)
                if pid == root:
                    return None
                continue
            parents[pid] = st.ppid
            if pid != root and st.ppid not in members:
                continue  # a stale cache entry (recycled pid): not in the tree any more
            members.add(pid)
            if st.state != "Z":
                total += st.rss_pages * self._page
                count += 1
            queue.extend(c for c in children.get(pid, ()) if c not in members)
        return TreeRss(rss=total, processes=count)


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
        self._cgroup = _CgroupReader(cgroup) if cgroup is not None else None
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
