"""Scaled memory is real: RSS rises when a piece is held and falls when it is freed."""

from __future__ import annotations

import psutil
import pytest

from cuzk_supervisor.sim.daemon.memory import MIB, Memory
from cuzk_supervisor.sim.daemon.model import GIB


def test_rss_follows_allocations_and_simulated_total_is_exact() -> None:
    proc = psutil.Process()
    grown: list[float] = []
    mem = Memory(scale_mib_per_gib=4, on_grow=lambda key, total: grown.append(total))
    before = proc.memory_info().rss
    mem.alloc("srs", 44)
    mem.alloc(("partition", 0), 15)
    held = proc.memory_info().rss
    assert mem.simulated_bytes == 59 * GIB
    assert grown == [44, 59]
    assert held - before == pytest.approx(59 * 4 * MIB, rel=0.1)
    assert mem.free(("partition", 0)) == 15
    after = proc.memory_info().rss
    assert held - after == pytest.approx(15 * 4 * MIB, rel=0.1)
    assert mem.simulated_bytes == 44 * GIB
    mem.free("srs")
    assert mem.simulated_bytes == 0


def test_zero_scale_tracks_without_allocating() -> None:
    mem = Memory(scale_mib_per_gib=0)
    mem.alloc("pce", 26)
    assert mem.simulated_bytes == 26 * GIB
    assert mem.free("nothing") == 0
