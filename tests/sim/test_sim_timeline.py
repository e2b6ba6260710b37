"""The simulated daemon's timeline (sim.daemon.timeline): when its pipeline waited for the client,
the
records it writes and reads back, and partition memory mapped off the event loop
(sim.daemon.pages)."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path

import psutil
import pytest
from simhelpers import poll_until

from cuzk_supervisor.sim.daemon.logfmt import DaemonLog
from cuzk_supervisor.sim.daemon.memory import MIB, Memory
from cuzk_supervisor.sim.daemon.model import GIB
from cuzk_supervisor.sim.daemon.pages import PAGE, Pages, touched_mapping
from cuzk_supervisor.sim.daemon.pipeline import Pipeline
from cuzk_supervisor.sim.daemon.timeline import JobTimes, Timeline, read_timeline, starved_s


def test_starved_counts_from_the_later_of_hunger_and_the_answer() -> None:
    assert starved_s(10.0, None, 0.0) == 0.0  # every slot busy or work waiting: no idle
    assert starved_s(10.0, 4.0, 7.0) == 3.0  # hungry since 4, the answer came at 7
    assert starved_s(10.0, 8.0, 7.0) == 2.0
    assert starved_s(10.0, 12.0, 7.0) == 0.0  # went hungry after it arrived


def test_the_pipeline_is_hungry_only_with_a_slot_free_and_nothing_waiting() -> None:
    pipe = Pipeline(slots=2, gpu_workers=1, partition_seconds=lambda active: 10.0)
    assert pipe.hungry_since == 0.0  # idle from the start
    pipe.submit(0, 5.0, partitions=3)  # two start, one waits
    assert pipe.hungry_since is None
    pipe.advance(15.0)  # two done, the third started: a slot free, nothing waiting
    assert pipe.hungry_since == 15.0
    pipe.submit(1, 20.0, partitions=1)  # fills the free slot
    assert pipe.hungry_since is None
    pipe.advance(25.0)  # the third partition done at 25: both slots free again
    assert pipe.hungry_since == 25.0


def test_records_read_back_with_their_process_and_the_latest_status(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    timeline = Timeline(path, DaemonLog("off"))
    timeline.start(time_scale=200.0, synthesis_slots=12, gpu_workers=2)
    admitted = JobTimes(0, "a", "porep-c2", "admitted", 1.5, 1.5, None, None, None, None, 1.5)
    timeline.job(admitted)
    timeline.job(JobTimes(0, "a", "porep-c2", "completed", 1.5, 1.5, None, 1.5, 59.0, 59.2, 1.5))
    timeline.job(JobTimes(1, "b", "porep-c2", "admitted", 60.0, 60.0, 0, None, None, None, 0.8))
    with path.open("a") as torn:
        torn.write('{"event": "job", "pid"')  # a daemon killed mid-line
    (a, b) = read_timeline(path)
    assert (a.times.status, a.times.completed_s, a.synthesis_slots, a.gpu_workers) == (
        "completed", 59.0, 12, 2,
    )  # fmt: skip
    assert a.times.ok
    assert a.unix(200.0) == pytest.approx(a.origin_unix + 1.0)
    assert (b.times.status, b.times.reply_to, b.times.completed_s) == ("admitted", 0, None)


def test_an_unwritable_timeline_is_one_warning(tmp_path: Path) -> None:
    out = tmp_path / "log"
    with out.open("wb") as stream:
        timeline = Timeline(tmp_path / "missing" / "timeline.jsonl", DaemonLog("info", stream))
        timeline.start(time_scale=1.0, synthesis_slots=1, gpu_workers=1)
        timeline.start(time_scale=1.0, synthesis_slots=1, gpu_workers=1)
    assert out.read_text().count("cannot write the timeline") == 1


def test_background_pieces_are_counted_at_once_and_backed_soon() -> None:
    proc = psutil.Process()
    mem = Memory(scale_mib_per_gib=4)
    before = proc.memory_info().rss
    mem.alloc(("partition", 0), 15, background=True)
    assert mem.simulated_bytes == 15 * GIB  # the accounting does not wait for the pages

    def risen() -> float:
        return (proc.memory_info().rss - before) / (60 * MIB)

    poll_until(lambda: risen() > 0.9, 5, interval=0.005, what="the pages backed")
    assert risen() == pytest.approx(1, rel=0.1)
    assert mem.free(("partition", 0)) == 15
    assert mem.simulated_bytes == 0
    poll_until(lambda: risen() < 0.1, 5, interval=0.005, what="the pages unmapped")


def test_pending_counts_the_changes_the_page_thread_has_not_made_yet() -> None:
    release = threading.Event()
    mapped: list[int] = []

    def slow_mapper(size: int) -> mmap.mmap:
        release.wait(10)  # a loaded machine: the thread is behind the accounting
        mapped.append(size)
        return touched_mapping(size)

    pages = Pages(mapper=slow_mapper)
    assert pages.pending == 0
    first = pages.map(PAGE)
    pages.map(2 * PAGE)
    pages.unmap(first)
    assert pages.pending == 3
    release.set()
    poll_until(lambda: pages.pending == 0, 5, interval=0.005, what="the page thread to catch up")
    assert mapped == [PAGE, 2 * PAGE]  # in the order asked
    assert first.buf is None
