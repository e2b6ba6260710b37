"""The CPU's busy share against the container's quota and physical cores (core.cpushare,
adapters.machine.cpumeter): a container held to 4 CPUs on a big host reads 100 % when it uses
4, and a host with hyperthreads reads 100 % when its physical cores are busy."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cuzk_supervisor.adapters.machine.cgroupfind import CgroupLocation
from cuzk_supervisor.adapters.machine.cpumeter import CpuMeter, discover_cpu_cgroup, meter_for
from cuzk_supervisor.core import cpushare


def test_capacity_is_the_quota_or_the_physical_cores_whichever_is_less() -> None:
    assert cpushare.capacity(4.0, 128, 2.0) == 4.0  # the quota
    assert cpushare.capacity(None, 128, 2.0) == 64.0  # physical cores
    assert cpushare.capacity(100.0, 16, 2.0) == 8.0  # a cpuset smaller than the quota
    assert cpushare.capacity(None, 1, 2.0) == 1.0


def test_busy_share() -> None:
    assert cpushare.busy_share(8.0, 2.0, 4.0) == 1.0
    assert cpushare.busy_share(2.0, 2.0, 4.0) == 0.25
    assert cpushare.busy_share(20.0, 2.0, 4.0) == 1.0  # hyperthreads beyond the cores: full
    assert cpushare.busy_share(1.0, 0.0, 4.0) is None


@pytest.mark.parametrize(
    ("text", "cpus"), [("max 100000", None), ("400000 100000", 4.0), ("junk", None), (None, None)]
)
def test_cpu_max(text: str | None, cpus: float | None) -> None:
    assert cpushare.quota_from_cpu_max(text) == cpus


def test_cfs() -> None:
    assert cpushare.quota_from_cfs(-1, 100000) is None
    assert cpushare.quota_from_cfs(250000, 100000) == 2.5


def test_a_v2_container_at_its_quota_reads_full(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    stat = tmp_path / "cpu.stat"
    clock = itertools.count(0.0, 10.0)
    meter = CpuMeter(CgroupLocation(2, tmp_path, tmp_path), clock=lambda: next(clock),
                     allowed_cpus=128, threads_per_core=2)  # fmt: skip
    assert meter.capacity == 4.0
    stat.write_text("usage_usec 1000000\nuser_usec 1\n")
    assert meter() is None  # the first call starts the interval
    stat.write_text("usage_usec 41000000\n")  # 40 CPU seconds in 10 s on 4 CPUs
    assert meter() == 1.0
    stat.write_text("usage_usec 61000000\n")  # 20 in 10 s
    assert meter() == pytest.approx(0.5)


def test_a_v1_cgroup_and_a_hyperthreaded_host(tmp_path: Path) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    usage = tmp_path / "cpuacct.usage"
    clock = itertools.count(0.0, 1.0)
    meter = CpuMeter(CgroupLocation(1, tmp_path, tmp_path), clock=lambda: next(clock),
                     allowed_cpus=32, threads_per_core=2)  # fmt: skip
    assert meter.capacity == 16.0
    usage.write_text("0\n")
    meter()
    usage.write_text(str(16 * 10**9))  # 16 physical cores busy for a second: 50 % of threads
    assert meter() == 1.0


def test_an_unreadable_cgroup_gives_no_figure(tmp_path: Path) -> None:
    meter = CpuMeter(CgroupLocation(2, tmp_path, tmp_path), allowed_cpus=4, threads_per_core=1)
    assert meter() is None
    assert meter() is None


def test_discovery_finds_the_cpuacct_hierarchy_or_the_unified_one(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("4:cpu,cpuacct:/docker/x\n3:memory:/docker/x\n0::/\n")
    (proc / "mountinfo").write_text(
        "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "31 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    found = discover_cpu_cgroup(tmp_path / "proc", tmp_path)
    assert found is not None
    assert found.version == 1
    assert found.dir == tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/x"
    (proc / "cgroup").write_text("0::/system.slice/c\n")
    (proc / "mountinfo").write_text("40 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    found = discover_cpu_cgroup(tmp_path / "proc", tmp_path)
    assert found is not None
    assert found.version == 2
    assert found.dir == tmp_path / "sys/fs/cgroup/system.slice/c"


def test_a_pinned_cgroup_root(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 0\n")
    meter = meter_for(tmp_path)
    assert meter.cgroup is not None
    assert meter.cgroup.version == 2
