"""Where the supervisor's memory cgroup is: pure parsers of ``/proc/<pid>/cgroup`` and
``mountinfo``, the choice of hierarchy (v1 memory controller or the v2 unified one), and
:func:`discover_memory_cgroup`, which reads those two files once.

Every root is a parameter so tests feed fixture folders.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from cuzk_supervisor.adapters.machine.kernelfiles import read_text

CgroupVersion = Literal[1, 2]


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where the memory cgroup lives: its folder and the hierarchy's mount point (the top of
    the ancestor walk). ``dir`` is a real path (already joined with the filesystem root)."""

    version: CgroupVersion
    dir: Path
    mount: Path


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
    """:func:`find_cgroup` for the ``memory`` controller."""
    return find_cgroup(cgroups, mounts, "memory")


def find_cgroup(
    cgroups: Iterable[CgroupLine], mounts: Iterable[Mount], controller: str
) -> CgroupPlace | None:
    """Locate the cgroup of ``controller`` from ``/proc/self/cgroup`` and ``mountinfo``.

    A v1 hierarchy carrying the controller wins when it is listed and mounted (on a hybrid host
    the unified ``0::`` line exists too but has no memory controller); else the unified ``0::path``
    line with a cgroup2 mount. The path is taken relative to the mount's root (with a cgroup
    namespace both are usually ``/``); one below no mount's root (moved out of its namespace's
    cgroup, shown as ``/..``) falls back to the mount point, the closest cgroup we can see.
    """
    cgroups, mounts = list(cgroups), list(mounts)
    v1 = [m for m in mounts if m.fstype == "cgroup" and controller in m.super_options]
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    for line in cgroups:
        if line.hierarchy_id != 0 and controller in line.controllers and v1:
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


def under(root: Path, path: PurePosixPath) -> Path:
    # Join an absolute path from /proc with a filesystem root (fixtures); "/" leaves it as is.
    return root / path.relative_to("/") if path.is_absolute() else root / path


def discover_memory_cgroup(
    proc_root: Path = Path("/proc"), fs_root: Path = Path("/"), pid: int | Literal["self"] = "self"
) -> CgroupLocation | None:
    return discover_cgroup("memory", proc_root, fs_root, pid)


def discover_cgroup(
    controller: str, proc_root: Path, fs_root: Path, pid: int | Literal["self"] = "self"
) -> CgroupLocation | None:
    """Find the cgroup of ``controller`` for ``pid`` from ``<proc_root>/<pid>/cgroup`` and
    ``mountinfo``; mount points are read below ``fs_root``. None when there is none to read."""
    base = proc_root / str(pid)
    cgroup_text, mountinfo_text = read_text(base / "cgroup"), read_text(base / "mountinfo")
    if cgroup_text is None or mountinfo_text is None:
        return None
    cgroups, mounts = parse_proc_cgroup(cgroup_text), parse_mountinfo(mountinfo_text)
    place = find_cgroup(cgroups, mounts, controller)
    if place is None:
        return None
    return CgroupLocation(
        place.version, under(fs_root, place.dir), under(fs_root, place.mount_point)
    )
