"""The daemon's peak RSS and liveness: work handed over spares the daemon process its own.

The peak RSS: one walk of its process tree a second, not two.

``DaemonProcess`` reads its tree's RSS for ``peak_rss_bytes``; in the lifecycle the memory
watch reads the same tree at least as often and hands its reading over (``note_rss``, through
``DaemonControl.note_memory``): the process then skips its own (issue 35: the supervisor's idle
CPU). Here two processes of a plain ``sleep``, side by side: the one handed readings takes none
of its own while the other goes on taking its own; and the peak watch, handed readings, waits
for them to stop. The liveness probe: a GetMetrics answer of the health watch's spares it
(``note_answer``), a new gRPC channel every 30 s less. And a failed output pump is said at the
daemon's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sized
from pathlib import Path

import structlog
from simhelpers import apoll_until, free_tcp_port

from cuzk_supervisor.address import Address
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.peakrss import NOTED_RECHECK_INTERVALS, PeakRss
from cuzk_supervisor.daemon.process import DaemonProcess
from cuzk_supervisor.daemon.spec import AliveProbe, DaemonSettings

MIB = 1 << 20


async def _answers(address: Address, deadline_s: float) -> None:
    """The ready probe of a daemon that is only a sleeping process: ready at once."""


def _sleeper(
    folder: Path,
    readings: list[int] | None,
    alive_probe: AliveProbe | None = None,
    liveness_interval_s: float = 30.0,
    time: VirtualTime | None = None,
) -> DaemonProcess:
    settings = DaemonSettings(
        binary=sys.executable,
        extra_args=("-c", "import time; time.sleep(300)"),
        config_path=folder / "cuzk.toml",
        log_path=folder / "cuzk.log",
        stop_grace_s=5.0,
        liveness_interval_s=liveness_interval_s,
        liveness_timeout_s=1.0,
    )
    values = DaemonConfigValues(
        partition_workers=1, total_budget_gib=89, max_parallel_synthesis=1,
        listen=f"127.0.0.1:{free_tcp_port()}", status_listen=f"127.0.0.1:{free_tcp_port()}",
    )  # fmt: skip

    def read(pid: int) -> int:
        assert readings is not None
        readings.append(pid)
        return MIB

    # A long interval: after its quick first readings (0.05 s, doubling), a reading handed
    # over stands for the rest of the test. No readings list: the product's tree reader.
    virtual = {"clock": time.clock, "sleep": time.sleep} if time is not None else {}
    return DaemonProcess(settings, values, ready_probe=_answers, rss_interval_s=600.0,
                         rss_sampler=read if readings is not None else None,
                         alive_probe=alive_probe or _answers,
                         **virtual)  # type: ignore[arg-type]  # fmt: skip


async def test_a_reading_handed_over_spares_the_process_its_own(tmp_path: Path) -> None:
    handed: list[int] = []
    own: list[int] = []
    watched, alone = _sleeper(tmp_path / "a", handed), _sleeper(tmp_path / "b", own)
    await watched.start()
    await alone.start()
    try:
        watched.note_rss(5 * MIB)
        before = len(handed)
        # The other one reads its own at 0.05, 0.1, 0.2, 0.4 and 0.8 s, and so would this one.
        await apoll_until(lambda: _at_least(own, before + 5), 120, what="readings of its own")
        assert len(handed) == before
        assert watched.peak_rss_bytes == 5 * MIB  # the reading handed over counts
        assert alone.peak_rss_bytes == MIB
    finally:
        await watched.stop()
        await alone.stop()


async def _at_least(readings: Sized, count: int) -> bool:
    return len(readings) >= count


class VirtualTime:
    """A clock and a sleep for the watches: each sleep moves the clock on at once (and lets the
    loop turn), and while ``handing`` calls ``hand_over`` as it wakes: the memory watch's (the
    health watch's) readings, come within the interval the watch slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handing = True
        self.hand_over: Callable[[], None] = lambda: None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.handing:
            self.hand_over()
        await asyncio.sleep(0)


async def _after(vt: VirtualTime, seconds: float) -> bool:
    return vt.now >= seconds


async def test_readings_handed_over_spare_the_peak_watch_until_they_stop() -> None:
    interval = 1.0
    own: list[int] = []

    def read(pid: int) -> int:
        own.append(pid)
        return MIB

    vt = VirtualTime()
    peak = PeakRss(read, interval, clock=vt.clock, sleep=vt.sleep)
    vt.hand_over = lambda: peak.note(2 * MIB)
    peak.note(3 * MIB)
    watch = asyncio.create_task(peak.watch(1))
    try:
        # Handed over all along, for a hundred times the wait after a note: none of its own.
        await apoll_until(lambda: _after(vt, 100 * NOTED_RECHECK_INTERVALS * interval), 30,
                          what="virtual time")  # fmt: skip
        assert own == []
        assert peak.bytes == 3 * MIB
        # They stop: its own readings come back.
        vt.handing = False
        await apoll_until(lambda: _at_least(own, 3), 30, what="readings of its own")
        assert peak.bytes == 3 * MIB
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def test_an_answer_seen_elsewhere_spares_the_liveness_probe(tmp_path: Path) -> None:
    probes: list[float] = []

    async def alive(address: Address, timeout_s: float) -> None:
        probes.append(vt.now)

    interval = 30.0
    vt = VirtualTime()
    daemon = _sleeper(tmp_path, [], alive_probe=alive, liveness_interval_s=interval, time=vt)
    vt.hand_over = daemon.note_answer  # the health watch's GetMetrics, answered
    await daemon.start()
    try:
        await apoll_until(lambda: _after(vt, 100 * interval), 30, what="virtual time")
        assert probes == []
        # No answer seen elsewhere: the probes come back.
        vt.handing = False
        await apoll_until(lambda: _at_least(probes, 3), 30, what="liveness probes")
    finally:
        await daemon.stop()


def _stat_files_open(pid: int) -> list[str]:
    """This process's descriptors on ``/proc/PID/stat``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == f"/proc/{pid}/stat":
                found.append(fd)
    return found


async def test_a_dead_daemons_stat_file_is_closed_at_its_exit(tmp_path: Path) -> None:
    """The peak watch keeps the daemon's stat file open between readings; a daemon that dies
    (killed, crashed) lets it go at its exit, not when a garbage collection finds its run: one
    descriptor more per restart until then (issue 44, the run phase's fd sawtooth)."""
    daemon = _sleeper(tmp_path, None)
    await daemon.start()
    pid = daemon.pid
    assert pid is not None
    try:

        async def open_now() -> bool:
            return bool(_stat_files_open(pid))

        await apoll_until(open_now, 60, what="the peak watch's stat file")
        os.kill(pid, signal.SIGKILL)
        await daemon.wait()
        assert _stat_files_open(pid) == []
    finally:
        await daemon.stop()


class _BrokenSink:
    """A line sink with a bug: the pump's task ends with its exception."""

    def line(self, text: str, index: int) -> None:
        raise RuntimeError(f"sink bug at line {index}")

    def end(self) -> None:
        pass


async def test_a_pump_that_failed_is_told_when_the_daemon_exits(tmp_path: Path) -> None:
    """Lines neither pushed nor counted are a bug of ours: said at the exit, not swallowed."""
    settings = DaemonSettings(
        binary=sys.executable, extra_args=("-c", "print('hello', flush=True)"),
        config_path=tmp_path / "cuzk.toml", log_path=tmp_path / "cuzk.log", stop_grace_s=5.0,
    )  # fmt: skip
    values = DaemonConfigValues(
        partition_workers=1, total_budget_gib=89, max_parallel_synthesis=1,
        listen=f"127.0.0.1:{free_tcp_port()}", status_listen=f"127.0.0.1:{free_tcp_port()}",
    )  # fmt: skip
    daemon = DaemonProcess(settings, values, ready_probe=_answers, alive_probe=_answers,
                           line_sinks=[_BrokenSink()])  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        await daemon.start()
        await daemon.wait()
    (failed,) = [e for e in logs if e["event"] == "daemon.output_pump_failed"]
    assert failed["reason"] == "RuntimeError: sink bug at line 0"
