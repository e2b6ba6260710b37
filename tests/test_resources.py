"""Memory samplers: pure parsers, cgroup v1/v2 discovery and reading from fixture trees, the
daemon process-tree RSS (fake /proc and a real process tree), the real sampler on this machine,
and the daemon's pid in a sample."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pacehelpers import patient

from cuzk_supervisor.adapters.machine.cgroupfind import (
    CgroupLine,
    CgroupLocation,
    Mount,
    discover_memory_cgroup,
    find_memory_cgroup,
    parse_mountinfo,
    parse_proc_cgroup,
)
from cuzk_supervisor.adapters.machine.cgroupmem import (
    UNLIMITED_THRESHOLD,
    CgroupReader,
    cgroup_memory_v1,
    cgroup_memory_v2,
    parse_limit,
    read_oom_kill_count,
    working_set,
)
from cuzk_supervisor.adapters.machine.kernelfiles import KernelFile, parse_keyed
from cuzk_supervisor.adapters.machine.proctree import ProcessTree, TreeRss, parse_proc_stat
from cuzk_supervisor.adapters.machine.psi import Psi, parse_psi
from cuzk_supervisor.adapters.machine.resources import (
    HostMemory,
    HostMemoryReader,
    MemorySampler,
    MemorySnapshot,
)

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
GIB = 1 << 30
MIB = 1 << 20
V1_UNLIMITED = "9223372036854771712"


def fake_host(total: int = 64 * GIB, available: int = 60 * GIB) -> HostMemory:
    return HostMemory(total=total, available=available, used=total - available)


def sampler_for(root: Path, **kw: object) -> MemorySampler:
    """A sampler reading everything below a fixture root, with a fixed host and clock."""
    kw.setdefault("host", fake_host)
    kw.setdefault("clock", lambda: 1234.5)
    return MemorySampler(proc_root=root / "proc", fs_root=root, **kw)  # type: ignore[arg-type]


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


# --------------------------------------------------------------------------------------------
# Pure parsers


def test_parse_proc_cgroup_v1_hybrid_and_v2() -> None:
    lines = parse_proc_cgroup((FIXTURES / "v1_hybrid/proc/self/cgroup").read_text())
    assert CgroupLine(4, ("memory",), "/process_api/job42") in lines
    assert CgroupLine(0, (), "/") in lines
    assert CgroupLine(9, ("name=systemd",), "/") in lines
    assert parse_proc_cgroup("0::/a/b\n") == [CgroupLine(0, (), "/a/b")]
    # Controllers joined by commas, and junk lines skipped.
    assert parse_proc_cgroup("5:cpu,cpuacct:/x\ngarbage\n\n") == [
        CgroupLine(5, ("cpu", "cpuacct"), "/x")
    ]


def test_parse_mountinfo_fields_optional_tags_and_escapes() -> None:
    mounts = parse_mountinfo((FIXTURES / "v2_nested/proc/self/mountinfo").read_text())
    cg = [m for m in mounts if m.fstype == "cgroup2"]
    assert cg == [
        Mount("/", "/sys/fs/cgroup", "cgroup2", ("rw", "nsdelegate", "memory_recursiveprot"))
    ]
    # No optional fields, and an escaped space in the mount point.
    text = "35 31 0:32 /a\\040b /mnt/my\\040cg rw - cgroup cgroup rw,memory\nshort line\n"
    assert parse_mountinfo(text) == [Mount("/a b", "/mnt/my cg", "cgroup", ("rw", "memory"))]


def _mounts(*specs: tuple[str, str, str, str]) -> list[Mount]:
    return [
        Mount(root, point, fstype, tuple(opts.split(","))) for root, point, fstype, opts in specs
    ]


def test_find_memory_cgroup_prefers_v1_memory_on_hybrid_host() -> None:
    root = FIXTURES / "v1_hybrid/proc/self"
    place = find_memory_cgroup(
        parse_proc_cgroup((root / "cgroup").read_text()),
        parse_mountinfo((root / "mountinfo").read_text()),
    )
    assert place is not None
    assert place.version == 1
    assert place.mount_point == PurePosixPath("/sys/fs/cgroup/memory")
    assert place.dir == PurePosixPath("/sys/fs/cgroup/memory/process_api/job42")


def test_find_memory_cgroup_v2_and_none() -> None:
    lines = [CgroupLine(0, (), "/user.slice/session-1.scope")]
    mounts = _mounts(("/", "/sys/fs/cgroup", "cgroup2", "rw"))
    place = find_memory_cgroup(lines, mounts)
    assert place is not None
    assert place.version == 2
    assert place.dir == PurePosixPath("/sys/fs/cgroup/user.slice/session-1.scope")
    # Listed but not mounted, or no memory controller anywhere: nothing to read.
    assert find_memory_cgroup(lines, []) is None
    assert find_memory_cgroup([CgroupLine(3, ("cpu",), "/")], mounts) is None
    v1_cpu_only = _mounts(("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"))
    assert find_memory_cgroup([CgroupLine(3, ("memory",), "/a")], v1_cpu_only) is None


def test_find_memory_cgroup_strips_the_mount_root() -> None:
    # Without a cgroup namespace the container sees its full path, and its own cgroup is what
    # is mounted (root = that path): the folder is the mount point plus what is left.
    lines = [CgroupLine(7, ("memory",), "/docker/abc/sub")]
    mounts = _mounts(
        ("/", "/host/cgroup/memory", "cgroup", "rw,memory"),
        ("/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
    )
    place = find_memory_cgroup(lines, mounts)
    assert place is not None
    assert place.dir == PurePosixPath("/sys/fs/cgroup/memory/sub")
    assert place.mount_point == PurePosixPath("/sys/fs/cgroup/memory")


def test_find_memory_cgroup_path_outside_namespace_falls_back_to_mount() -> None:
    mounts = _mounts(("/", "/sys/fs/cgroup", "cgroup2", "rw"))
    for path in ("/..", "/../other"):
        place = find_memory_cgroup([CgroupLine(0, (), path)], mounts)
        assert place is not None
        assert place.dir == PurePosixPath("/sys/fs/cgroup")
    elsewhere = _mounts(("/docker/x", "/sys/fs/cgroup", "cgroup2", "rw"))
    place = find_memory_cgroup([CgroupLine(0, (), "/system.slice")], elsewhere)
    assert place is not None
    assert place.dir == PurePosixPath("/sys/fs/cgroup")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max\n", None),
        (f"{V1_UNLIMITED}\n", None),
        ("9223372036854775807", None),
        (str(UNLIMITED_THRESHOLD), None),
        (str(UNLIMITED_THRESHOLD - 1), UNLIMITED_THRESHOLD - 1),
        ("8589934592\n", 8 * GIB),
        ("0", 0),
        ("-1", None),
        ("", None),
        ("junk", None),
        (None, None),
    ],
)
def test_parse_limit(text: str | None, expected: int | None) -> None:
    assert parse_limit(text) == expected


@given(st.integers(min_value=0, max_value=UNLIMITED_THRESHOLD - 1))
def test_parse_limit_keeps_every_real_limit(value: int) -> None:
    assert parse_limit(f"{value}\n") == value


def test_parse_psi_both_lines_some_only_and_junk() -> None:
    text = (FIXTURES / "v1_hybrid/proc/pressure/memory").read_text()
    assert parse_psi(text) == Psi(1.5, 0.75, 123456, 0.5, 0.25, 65432)
    assert parse_psi("some avg10=2.00 avg60=1.00 avg300=0.00 total=5\n") == Psi(2.0, 1.0, 5)
    assert parse_psi("") is None
    assert parse_psi(None) is None
    assert parse_psi("some avg10=x avg60=1 total=2") is None


def test_parse_keyed_filters_and_skips_junk() -> None:
    text = "oom 2\noom_kill 1\nbad line\nmax x\n"
    assert parse_keyed(text) == {"oom": 2, "oom_kill": 1}
    assert parse_keyed(text, ("oom_kill",)) == {"oom_kill": 1}
    assert parse_keyed(None) == {}


@given(st.integers(min_value=0, max_value=1 << 50), st.integers(min_value=0, max_value=1 << 50))
def test_working_set_is_within_zero_and_usage(usage: int, inactive: int) -> None:
    ws = working_set(usage, inactive)
    assert ws is not None
    assert 0 <= ws <= usage
    assert ws == max(0, usage - inactive)


def test_working_set_unknowns() -> None:
    assert working_set(None, 5) is None
    assert working_set(100, None) == 100  # no inactive_file figure: the cautious answer


def test_cgroup_memory_v2_effective_limit_is_the_minimum_on_the_path() -> None:
    cg = cgroup_memory_v2(
        ["max\n", "17179869184\n", "max\n", None],
        "4294967296\n",
        "file 1073741824\ninactive_file 536870912\n",
        "oom 2\noom_kill 1\n",
        None,
    )
    assert cg.limit == 16 * GIB
    assert cg.usage == 4 * GIB
    assert cg.working_set == 4 * GIB - 512 * MIB
    assert (cg.file, cg.oom, cg.oom_kill, cg.under_oom, cg.psi) == (GIB, 2, 1, None, None)
    assert cgroup_memory_v2(["max", "max"], None, None, None, None).limit is None
    assert cgroup_memory_v2(["max", "100", "50"], None, None, None, None).limit == 50


def test_cgroup_memory_v1_hierarchical_limit_and_counters() -> None:
    stat = "total_inactive_file 300\ninactive_file 100\ntotal_cache 900\n"
    cg = cgroup_memory_v1(
        V1_UNLIMITED,
        "1000",
        stat + "hierarchical_memory_limit 4096\n",
        "oom_kill_disable 0\nunder_oom 1\noom_kill 7\n",
    )
    # Our own limit is "unlimited" but an ancestor's binds: the hierarchical one counts.
    assert cg.limit == 4096
    # total_inactive_file (this cgroup and its children, like usage) wins over inactive_file.
    assert cg.working_set == 700
    assert (cg.file, cg.oom, cg.oom_kill, cg.under_oom) == (900, None, 7, True)
    unlimited = cgroup_memory_v1(
        V1_UNLIMITED, "1000", f"hierarchical_memory_limit {V1_UNLIMITED}", ""
    )
    assert unlimited.limit is None
    assert unlimited.oom_kill is None
    assert unlimited.under_oom is None
    own_lower = cgroup_memory_v1("2048", None, "hierarchical_memory_limit 4096\n", None)
    assert own_lower.limit == 2048


def test_parse_proc_stat_with_awkward_comm() -> None:
    fields = " ".join(str(n) for n in range(4, 53))  # fields 4.. (ppid first)
    text = f"123 (my (odd) name) S {fields}\n"
    st_ = parse_proc_stat(text)
    assert st_ is not None
    assert st_.state == "S"
    assert st_.ppid == 4
    assert st_.rss_pages == 24
    assert parse_proc_stat("123 (x) S 1 2") is None
    assert parse_proc_stat(None) is None


# --------------------------------------------------------------------------------------------
# Sampler on fixture trees


def test_sampler_v1_hybrid_fixture() -> None:
    sampler = sampler_for(FIXTURES / "v1_hybrid")
    loc = sampler.cgroup
    assert loc is not None
    assert loc.version == 1
    assert loc.dir == FIXTURES / "v1_hybrid/sys/fs/cgroup/memory/process_api/job42"
    snap = sampler.sample(None)
    assert snap.timestamp == 1234.5
    assert (snap.host_total, snap.host_available) == (64 * GIB, 60 * GIB)
    assert snap.cgroup_version == 1
    assert snap.cgroup_limit == 8 * GIB
    assert snap.cgroup_usage == 2 * GIB
    assert snap.cgroup_inactive_file == 256 * MIB
    assert snap.cgroup_working_set == 2 * GIB - 256 * MIB
    assert (snap.cgroup_oom, snap.cgroup_oom_kill, snap.cgroup_under_oom) == (None, 3, False)
    # v1 has no per-cgroup PSI: the system's.
    assert snap.psi_source == "system"
    assert (snap.psi_some_avg10, snap.psi_full_avg10) == (1.5, 0.5)
    assert (snap.daemon_pid, snap.daemon_rss, snap.daemon_processes) == (None, None, 0)
    assert snap.effective_limit == 8 * GIB
    assert snap.headroom == 8 * GIB - (2 * GIB - 256 * MIB)


def test_sampler_v1_unlimited_is_none(tmp_path: Path) -> None:
    root = copy_fixture("v1_hybrid", tmp_path)
    cg = root / "sys/fs/cgroup/memory/process_api/job42"
    (cg / "memory.limit_in_bytes").write_text(V1_UNLIMITED + "\n")
    stat = (cg / "memory.stat").read_text().replace("8589934592", V1_UNLIMITED)
    (cg / "memory.stat").write_text(stat)
    snap = sampler_for(root).sample()
    assert snap.cgroup_limit is None
    assert snap.effective_limit == 64 * GIB  # the host's
    assert snap.cgroup_working_set == 2 * GIB - 256 * MIB


def test_sampler_v2_nested_parent_limit_and_cgroup_psi() -> None:
    sampler = sampler_for(FIXTURES / "v2_nested")
    loc = sampler.cgroup
    assert loc is not None
    assert loc.version == 2
    assert loc.mount == FIXTURES / "v2_nested/sys/fs/cgroup"
    snap = sampler.sample()
    assert snap.cgroup_limit == 16 * GIB  # cuzk.service's, above our own "max"
    assert snap.cgroup_usage == 4 * GIB
    assert snap.cgroup_working_set == 4 * GIB - 512 * MIB
    assert snap.cgroup_file == GIB
    assert (snap.cgroup_oom, snap.cgroup_oom_kill, snap.cgroup_under_oom) == (2, 1, None)
    assert snap.psi_source == "cgroup"
    assert (snap.psi_some_avg10, snap.psi_full_avg10) == (12.34, 8.76)
    assert read_oom_kill_count(loc.dir) == 1


def test_sampler_v2_all_max_and_no_psi_anywhere(tmp_path: Path) -> None:
    root = copy_fixture("v2_nested", tmp_path)
    service = root / "sys/fs/cgroup/system.slice/cuzk.service"
    (service / "memory.max").write_text("max\n")
    (service / "supervisor/memory.pressure").unlink()
    snap = sampler_for(root).sample()
    assert snap.cgroup_limit is None
    assert snap.cgroup_usage == 4 * GIB
    # Neither cgroup nor system PSI (no /proc/pressure in this tree): None, not an error.
    assert (snap.psi, snap.psi_source, snap.psi_some_avg10) == (None, None, None)


def test_sampler_v2_container_namespace_root() -> None:
    sampler = sampler_for(FIXTURES / "v2_container")
    loc = sampler.cgroup
    assert loc is not None
    assert loc.dir == FIXTURES / "v2_container/sys/fs/cgroup"
    snap = sampler.sample()
    assert snap.cgroup_limit == 32 * GIB
    assert snap.cgroup_working_set == GIB
    assert snap.cgroup_oom_kill == 0
    # The cgroup limit is below the host's RAM here: the host wins.
    small = sampler_for(FIXTURES / "v2_container", host=lambda: fake_host(16 * GIB, 15 * GIB))
    assert small.sample().effective_limit == 16 * GIB


def test_sampler_without_memory_controller() -> None:
    sampler = sampler_for(FIXTURES / "no_memory")
    assert sampler.cgroup is None
    snap = sampler.sample()
    assert snap.cgroup_version is None
    assert snap.cgroup_limit is None
    assert snap.cgroup_working_set is None
    assert snap.cgroup_oom_kill is None
    assert snap.psi is None
    assert snap.effective_limit == 64 * GIB
    assert snap.headroom == 60 * GIB


def test_sampler_with_no_proc_files_and_missing_cgroup_files(tmp_path: Path) -> None:
    assert discover_memory_cgroup(tmp_path / "proc", tmp_path) is None
    assert sampler_for(tmp_path).sample().cgroup_limit is None
    # A pinned folder with none of the files: every cgroup figure None, no exception.
    empty = tmp_path / "empty"
    empty.mkdir()
    for version in (1, 2):
        loc = CgroupLocation(version, empty, empty)
        snap = sampler_for(tmp_path, cgroup=loc).sample()
        assert snap.cgroup_version == version
        assert (snap.cgroup_limit, snap.cgroup_usage, snap.cgroup_working_set) == (None,) * 3
        assert (snap.cgroup_oom, snap.cgroup_oom_kill, snap.cgroup_under_oom) == (None,) * 3


def test_pinned_cgroup_folder_like_the_sims(tmp_path: Path) -> None:
    # The simulated daemon bumps oom_kill in a cgroup-like folder; the sampler can be pointed at
    # it, and the existing read_oom_kill_count reads the same counter.
    folder = tmp_path / "cg"
    folder.mkdir()
    (folder / "memory.events").write_text("oom 1\noom_kill 1\n")
    sampler = sampler_for(tmp_path, cgroup=CgroupLocation(2, folder, folder), discover=False)
    snap = sampler.sample()
    assert (snap.cgroup_oom, snap.cgroup_oom_kill) == (1, 1)
    assert read_oom_kill_count(folder) == 1
    assert sampler_for(tmp_path / "nothing", discover=False).cgroup is None


def test_read_oom_kill_count_v1_and_missing() -> None:
    assert read_oom_kill_count(FIXTURES / "v1_hybrid/sys/fs/cgroup/memory/process_api/job42") == 3
    assert read_oom_kill_count(FIXTURES / "no_memory") is None


# --------------------------------------------------------------------------------------------
# Headroom and interval


def snapshot(**kw: object) -> MemorySnapshot:
    base: dict[str, object] = dict.fromkeys(MemorySnapshot.__slots__)
    base.update(timestamp=0.0, host_total=100 * GIB, host_available=90 * GIB, host_used=10 * GIB)
    base["daemon_processes"] = 0
    base.update(kw)
    return MemorySnapshot(**base)  # type: ignore[arg-type]


def test_headroom_uses_the_tighter_of_host_and_cgroup() -> None:
    assert snapshot().headroom == 90 * GIB
    s = snapshot(cgroup_limit=20 * GIB, cgroup_working_set=18 * GIB)
    assert s.effective_limit == 20 * GIB
    assert s.headroom == 2 * GIB
    assert s.headroom_fraction == pytest.approx(0.1)
    # Host nearly full while the cgroup has room: the host is the wall.
    s = snapshot(host_available=GIB, cgroup_limit=50 * GIB, cgroup_working_set=GIB)
    assert s.headroom == GIB
    over = snapshot(cgroup_limit=10 * GIB, cgroup_working_set=11 * GIB)
    assert over.headroom == -GIB


# --------------------------------------------------------------------------------------------
# Process tree


def _write_stat(proc: Path, pid: int, ppid: int, rss_pages: int, state: str = "S") -> None:
    d = proc / str(pid)
    d.mkdir(exist_ok=True)
    # Fields 4..52 after "pid (comm) state"; ppid is field 4, rss field 24.
    rest = [str(ppid)] + ["0"] * 49
    rest[24 - 4] = str(rss_pages)
    (d / "stat").write_text(f"{pid} (proc {pid}) {state} {' '.join(rest)}\n")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_process_tree_fake_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # non-numeric entries are ignored
    for pid, ppid, rss in (
        (1, 0, 10),
        (100, 1, 1000),
        (101, 100, 200),
        (102, 101, 30),
        (103, 1, 7),
    ):
        _write_stat(proc, pid, ppid, rss)
    clock = Clock()
    tree = ProcessTree(proc, page_size=4096, clock=clock, full_rescan_s=30)
    r = tree.rss(100)
    assert r is not None
    assert (r.rss, r.processes) == (1230 * 4096, 3)

    # A new child appears; a zombie holds nothing; a grandchild vanishes.
    _write_stat(proc, 104, 100, 5)
    _write_stat(proc, 105, 100, 999, state="Z")
    shutil.rmtree(proc / "102")
    r = tree.rss(100)
    assert r is not None
    assert (r.rss, r.processes) == (1205 * 4096, 3)

    # pid 101 recycled by an unrelated process between samples (same listing): dropped.
    _write_stat(proc, 101, 1, 50)
    r = tree.rss(100)
    assert r is not None
    assert (r.rss, r.processes) == (1005 * 4096, 2)

    # A non-member recycled as a new child of the tree is found by the periodic full rescan.
    _write_stat(proc, 103, 100, 7)
    r = tree.rss(100)
    assert r is not None
    assert r.processes == 2
    clock.now = 31.0
    r = tree.rss(100)
    assert r is not None
    assert (r.rss, r.processes) == (1012 * 4096, 3)

    assert tree.rss(4242) is None  # no such root
    assert ProcessTree(tmp_path / "no-proc").rss(1) is None


def test_process_tree_entry_vanishing_mid_scan(tmp_path: Path) -> None:
    # Listed, but its stat file is gone by the time it is read (exited mid-scan): skipped.
    proc = tmp_path / "proc"
    proc.mkdir()
    _write_stat(proc, 10, 1, 100)
    _write_stat(proc, 11, 10, 100)
    (proc / "12").mkdir()  # listed, no stat
    tree = ProcessTree(proc, page_size=1)
    r = tree.rss(10)
    assert r is not None
    assert (r.rss, r.processes) == (200, 2)


_GRANDCHILD = (
    "import sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "block = b'x' * (30 << 20)\n"  # written byte by byte: every page is touched
    "print('allocated', flush=True)\n"
    "sys.stdin.readline()\n"
)
_CHILD = (
    "import subprocess, sys\n"
    f"g = subprocess.Popen([sys.executable, '-c', {_GRANDCHILD!r}], stdin=subprocess.PIPE)\n"
    "for line in sys.stdin:\n"  # forward the test's lines to the grandchild
    "    g.stdin.write(line.encode()); g.stdin.flush()\n"
    "g.stdin.close(); g.wait()\n"
)


def test_daemon_tree_rss_of_a_real_process_tree() -> None:
    sampler = MemorySampler(clock=time.monotonic)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        before = sampler.sample(child.pid)
        assert before.daemon_processes == 2
        assert before.daemon_rss is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "allocated"
        deadline = time.monotonic() + patient(10)
        while True:
            after = sampler.sample(child.pid)
            assert after.daemon_rss is not None
            grown = after.daemon_rss - before.daemon_rss
            if grown >= 28 * MIB or time.monotonic() > deadline:
                break
        assert 28 * MIB <= grown <= 40 * MIB, grown / MIB
        assert after.daemon_processes == 2
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert sampler.sample(child.pid).daemon_rss is None  # gone (and reaped)


# --------------------------------------------------------------------------------------------
# This machine


def test_real_sampler_on_this_machine() -> None:
    sampler = MemorySampler()
    snap = sampler.sample(os.getpid())
    assert snap.host_total > 0
    assert 0 < snap.host_available <= snap.host_total
    assert snap.daemon_rss is not None
    assert snap.daemon_rss > 10 * MIB
    assert snap.daemon_processes >= 1
    assert 0 < snap.effective_limit <= snap.host_total
    if Path("/proc/pressure/memory").exists():
        assert snap.psi is not None
    cgroup_text = Path("/proc/self/cgroup").read_text()
    if ":memory:" in cgroup_text:  # v1 (the development machines): it must be found
        assert sampler.cgroup is not None
        assert sampler.cgroup.version == 1
    if sampler.cgroup is not None and snap.cgroup_usage is not None:
        assert snap.cgroup_usage > 0
        assert snap.cgroup_working_set is not None
        assert snap.cgroup_working_set <= snap.cgroup_usage
        assert snap.cgroup_limit is None or snap.cgroup_limit > 0


# --------------------------------------------------------------------------------------------
# The daemon's pid


def test_a_sample_measures_the_daemon_pid_it_is_given() -> None:
    sampler = sampler_for(FIXTURES / "v2_nested", tree=ProcessTree())  # the real /proc for pids
    assert sampler.sample(None).daemon_pid is None
    snap = sampler.sample(os.getpid())
    assert snap.daemon_pid == os.getpid()
    assert snap.daemon_rss is not None


# --------------------------------------------------------------------------------------------
# Files read every sample (issue 35: the idle supervisor's CPU)


def _fds_on(path: str) -> list[int]:
    """This process's descriptors open on ``path``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                out.append(int(fd))
    return out


def test_a_kernel_file_is_read_afresh_through_one_descriptor() -> None:
    path = f"/proc/{os.getpid()}/status"
    file = KernelFile(path)
    first = file.read()
    assert first is not None
    assert "VmRSS:" in first
    held = _fds_on(path)
    assert len(held) == 1  # kept open (size 0: rendered by the kernel at each read)
    block = b"x" * (64 << 20)  # the file is rendered again: the next read sees it
    second = file.read()
    assert second is not None
    rss = [int(line.split()[1]) for text in (first, second) for line in text.splitlines()
           if line.startswith("VmRSS:")]  # fmt: skip
    assert rss[1] - rss[0] >= 60 << 10, rss
    assert _fds_on(path) == held
    del block
    file.close()
    assert _fds_on(path) == []


def test_a_regular_file_is_opened_at_each_read_and_follows_a_replacement(tmp_path: Path) -> None:
    # The simulator's cgroup-like folder: its files are replaced by a rename.
    path = tmp_path / "memory.current"
    path.write_text("100\n")
    file = KernelFile(path)
    assert file.read() == "100\n"
    assert _fds_on(str(path)) == []
    fresh = tmp_path / "new"
    fresh.write_text("200\n")
    os.replace(fresh, path)
    assert file.read() == "200\n"
    path.unlink()
    assert file.read() is None
    path.write_text("300\n")
    assert file.read() == "300\n"
    assert KernelFile(tmp_path / "absent").read() is None


def test_a_kernel_file_that_fails_a_read_is_opened_again(monkeypatch: pytest.MonkeyPatch) -> None:
    file = KernelFile("/proc/meminfo")
    assert file.read() is not None
    real = os.pread
    calls = {"n": 0}

    def failing_once(fd: int, n: int, offset: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENODEV, "gone")
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", failing_once)
    assert file.read() is None
    assert _fds_on("/proc/meminfo") == []  # closed after the failure
    assert file.read() is not None  # opened again
    file.close()


def test_a_file_longer_than_one_read_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big"
    text = "k 1\n" * 40_000  # 160 KB: more than one 64 KiB read
    path.write_text(text)
    assert KernelFile(path).read() == text


def test_host_memory_from_meminfo_as_psutil_reads_it(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    4000000 kB\n"
    )
    host = HostMemoryReader(meminfo)()
    assert (host.total, host.available, host.used) == (16_000_000 << 10, 4_000_000 << 10,
                                                        12_000_000 << 10)  # fmt: skip
    # No MemAvailable (a kernel before 3.14), 0, more than the total, or no file: psutil's
    # estimate of the real host.
    real = psutil.virtual_memory()
    for text in ("MemTotal: 16000000 kB\nMemFree: 100 kB\n",
                 "MemTotal: 16000000 kB\nMemAvailable: 0 kB\n",
                 "MemTotal: 16000000 kB\nMemAvailable: 17000000 kB\n"):  # fmt: skip
        meminfo.write_text(text)
        assert HostMemoryReader(meminfo)().total == real.total
    assert HostMemoryReader(tmp_path / "absent")().total == real.total


def test_host_memory_of_this_machine_matches_psutil() -> None:
    ours, theirs = HostMemoryReader()(), psutil.virtual_memory()
    assert ours.total == theirs.total
    assert abs(ours.available - theirs.available) < 256 * MIB  # read a moment apart
    assert ours.used == ours.total - ours.available


def test_cgroup_limits_and_oom_counters_are_read_at_their_own_pace(tmp_path: Path) -> None:
    root = copy_fixture("v1_hybrid", tmp_path)
    folder = root / "sys/fs/cgroup/memory/process_api/job42"
    clock = Clock()
    reader = CgroupReader(CgroupLocation(1, folder, root / "sys/fs/cgroup/memory"),
                          slow_every_s=10, clock=clock)  # fmt: skip
    first = reader.read()
    assert (first.usage, first.oom_kill) == (2 * GIB, 3)
    (folder / "memory.usage_in_bytes").write_text(f"{3 * GIB}\n")
    oom = (folder / "memory.oom_control").read_text().replace("oom_kill 3", "oom_kill 4")
    (folder / "memory.oom_control").write_text(oom)
    clock.now = 9.0
    second = reader.read()
    assert (second.usage, second.oom_kill) == (3 * GIB, 3)  # usage at once, the counter later
    clock.now = 10.0
    assert reader.read().oom_kill == 4
    every = CgroupReader(CgroupLocation(1, folder, root / "sys/fs/cgroup/memory"))
    assert every.read().oom_kill == 4  # the default: every file at every read


def test_tree_listing_spaced_new_children_count_from_the_next_listing(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    _write_stat(proc, 100, 1, 1000)
    _write_stat(proc, 101, 100, 200)
    clock = Clock()
    tree = ProcessTree(proc, page_size=1, clock=clock, list_every_s=5)
    assert tree.rss(100) == TreeRss(1200, 2)
    _write_stat(proc, 102, 100, 30)  # a new child
    _write_stat(proc, 100, 1, 1500)  # a member's RSS: read at every call
    clock.now = 4.0
    assert tree.rss(100) == TreeRss(1700, 2)
    clock.now = 5.0
    assert tree.rss(100) == TreeRss(1730, 3)
    shutil.rmtree(proc / "101")  # a member gone: at once
    clock.now = 6.0
    assert tree.rss(100) == TreeRss(1530, 2)
    _write_stat(proc, 300, 1, 7)  # a root not seen before: listed at once
    _write_stat(proc, 301, 300, 8)
    assert tree.rss(300) == TreeRss(15, 2)


def test_the_tree_keeps_its_members_stat_files_open_and_lets_go_of_them() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    assert child.stdin is not None
    path = f"/proc/{child.pid}/stat"
    tree = ProcessTree(list_every_s=5)
    try:
        first = tree.rss(child.pid)
        assert first is not None
        assert first.processes == 1
        assert len(_fds_on(path)) == 1
        assert tree.rss(child.pid) is not None
        assert len(_fds_on(path)) == 1  # the same descriptor, not another
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert tree.rss(child.pid) is None
    assert _fds_on(path) == []
