"""The tests' own pace (tests/pacehelpers.py, loadhelpers.py) and the slow machine CI makes
(.ci/cpu-limited)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pacehelpers
import pytest
from loadhelpers import MAX_CONTENTION, contention
from pacehelpers import Pace, workers_for

ROOT = Path(__file__).resolve().parent.parent
CPU_LIMITED = ROOT / ".ci" / "cpu-limited"


def pace(cores: int = 2, speed: float = 1.0, contention: float = 1.0) -> Pace:
    return Pace(cores=cores, speed=speed, contention=contention, load=0.0)


def test_the_reference_machine_and_its_own_spread_are_not_slow():
    assert pace().slowness == 1.0
    assert pace().workers == 8
    # A quarter less (other work, a slower VM's moment) is what the suite takes in its stride.
    assert pace(contention=1.25).slowness == 1.0
    assert pace(speed=1.2).workers == 8


def test_a_third_of_the_machine_runs_fewer_workers_at_a_slower_pace():
    third = pace(contention=3.0)
    assert third.capacity == pytest.approx(2 / 3)
    assert third.slowness == pytest.approx(2.4)
    assert third.workers == 3
    # ... and with another job taking half of the machine it is slower still.
    assert third.with_contention(6.0).slowness == pytest.approx(4.8)


def test_a_much_slower_machine_gets_two_workers_and_a_bounded_slowness():
    slow = pace(cores=1, speed=5.0, contention=2.0)
    assert slow.workers == 2
    assert slow.slowness == pacehelpers.MAX_SLOWNESS
    assert workers_for(100.0) == 2


def test_more_cores_than_the_reference_do_not_make_it_faster_than_the_reference():
    big = pace(cores=64)
    assert (big.slowness, big.workers) == (1.0, 8)


def test_the_make_line_honours_a_slowness_given_by_hand():
    env = {**os.environ, pacehelpers.SLOWNESS_ENV: "3"}
    done = subprocess.run(
        [sys.executable, pacehelpers.__file__, "--make"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    workers, slowness, *why = done.stdout.split()
    assert (workers, slowness) == ("3", "3")
    assert pacehelpers.SLOWNESS_ENV in " ".join(why)


def test_a_command_runs_inside_a_cpu_cgroup_limited_to_its_share_and_the_cgroup_goes():
    # The command prints its own cgroups; the script says where it made the limit, or why it
    # could not (then it ran nothing and exits 0: the CI step is skipped, not failed).
    done = subprocess.run(
        [str(CPU_LIMITED), "--share", "1/4", "--", "cat", "/proc/self/cgroup"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if "SKIPPED" in done.stderr:
        assert done.stdout == ""
        assert "no CPU-limited cgroup here" in done.stderr
        return
    made = next(line for line in done.stderr.splitlines() if "cgroup v" in line)
    folder = Path(made.split()[3].rstrip(":"))
    cores = len(os.sched_getaffinity(0))
    assert f"{cores * 100_000 // 4} us of CPU every 100000 us" in made
    assert f"/{folder.name}\n" in done.stdout  # the command ran inside it ...
    assert not folder.exists()  # ... and it is gone


def test_what_is_left_is_the_quota_or_what_other_work_leaves_whichever_is_less():
    assert contention(2, 0.0, None) == 1.0
    assert contention(2, 1.0, None) == pytest.approx(2.0)
    assert contention(2, 0.0, 2 / 3) == pytest.approx(3.0)
    assert contention(2, 1.5, 2 / 3) == pytest.approx(4.0)
    assert contention(2, 5.0, None) == pytest.approx(MAX_CONTENTION)  # all taken by others


def test_a_bad_share_is_a_usage_error():
    done = subprocess.run(
        [str(CPU_LIMITED), "--share", "a third", "--", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is not N/D" in done.stderr
