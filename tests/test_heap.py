"""What the phases before the run phase leave free goes back to the system as it begins."""

from __future__ import annotations

import os
import platform

from phasefakes import build

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.machine.heap import release_free_memory
from cuzk_supervisor.core.reports import RUNNING


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_free_pages_below_a_live_block_go_back_to_the_system():
    """400 blocks of 100 KB (below glibc's mmap threshold: on its heap), all freed but the last,
    which holds the heap's top where glibc would give back by itself."""
    blocks = [bytearray(100_000) for _ in range(400)]
    last = blocks[-1]
    del blocks
    before = _rss_bytes()
    release_free_memory()
    after = _rss_bytes()
    assert last is not None
    if platform.libc_ver()[0] == "glibc":  # malloc_trim is glibc's; elsewhere gc alone
        assert before - after > 20_000_000, (before, after)


async def test_the_run_phase_begins_by_giving_back_what_the_bench_left_free():
    rig = build()
    calls: list[tuple[str, str]] = []
    rig.machine.release_memory = lambda: calls.append((rig.phases[-1], rig.manager.kinds()[-1]))
    assert await rig.run() == exitcodes.OK
    assert calls == [("run", RUNNING)]  # once, in the run phase, after /running was sent


async def test_the_run_phase_drops_the_proof_input_before_giving_memory_back():
    """The C1's submit request (51 MB in the field) is not held for the days of the run phase:
    released once, in the run phase, before the heap is trimmed (so its pages go back too)."""
    rig = build()
    seen: list[list[str]] = []
    rig.machine.release_memory = lambda: seen.append(list(rig.proofs.released))
    assert await rig.run() == exitcodes.OK
    assert rig.proofs.released == ["run"]
    assert seen == [["run"]]
