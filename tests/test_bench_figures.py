"""The pure figures of two benchmarks (issue 44): the compressed days of the run phase
(``bench/_days.py``: a restart's sawtooth is not growth, a leak is) and the fleet's recovery
after the manager's outage (``bench/_fleetoutage.py``: its busiest 10 s)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import _days  # bench/ is not a package
from _fleetoutage import busiest_10s_per_s
from _harness import Row

MIB = _days.MIB


def _run(fds: list[int], rss_step: int = 0) -> list[_days.Sample]:
    return [_days.Sample(float(t), 50 * MIB + t * rss_step, n, 11) for t, n in enumerate(fds)]


def _by_name(rows: list[Row], start: str) -> Row:
    (row,) = [r for r in rows if r.name.startswith(start)]
    return row


def test_a_sawtooth_from_restarts_is_not_growth() -> None:
    # Every 3 s a restart holds 5 more descriptors for a second: the floor stays at 20.
    fds = [25 if t % 3 == 0 else 20 for t in range(100)]
    rows = _days.rows(_run(fds), _days.windows_for(100), 100.0, restarts=33)
    growth = _by_name(rows, "open fds growth")
    assert growth.value == 0
    assert growth.ok is True
    assert _by_name(rows, "open fds, most").value == 25


def test_one_descriptor_kept_per_restart_is_growth() -> None:
    fds = [20 + t // 3 + (5 if t % 3 == 0 else 0) for t in range(100)]
    rows = _days.rows(_run(fds), _days.windows_for(100), 100.0, restarts=33)
    growth = _by_name(rows, "open fds growth")
    assert growth.value == pytest.approx(27)  # floor 23 in [10, 20], 50 in [90, 100]
    assert growth.ok is False


def test_the_rss_target_is_two_mib_for_four_simulated_days_scaled() -> None:
    win = _days.windows_for(3600)  # an hour at 100x: judged from 360 s to the end
    assert _days.rss_target_mib(win, 100.0) == pytest.approx(2.0 * 3240 * 100 / 86_400 / 4)
    # A steady climb of 1 KiB a second: 2.8 MiB between the windows' floors, a miss.
    samples = [_days.Sample(float(t), 50 * MIB + t * 1024, 20, 11) for t in range(3601)]
    rss = _by_name(_days.rows(samples, win, 100.0, 0), "RSS growth")
    assert rss.value == pytest.approx((3240 - 360) * 1024 / MIB)
    assert rss.ok is False
    judged = _days.judge(samples, win, 100.0, "rss")
    assert judged is not None
    assert judged.per_day == pytest.approx(1024 / 100 * 86_400)


def test_the_busiest_ten_seconds_after_an_outage() -> None:
    steady = [t + 0.5 for t in range(100)]  # one a second
    burst = [20 + i / 30 for i in range(300)]  # 300 more in [20, 30)
    assert busiest_10s_per_s(steady, 0, 100) == pytest.approx(1.0)
    assert busiest_10s_per_s(steady + burst, 0, 100) == pytest.approx(31.0)
