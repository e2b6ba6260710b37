"""The daemon's peak RSS: one walk of its process tree a second, not two.

``DaemonProcess`` reads its tree's RSS for ``peak_rss_bytes``; in the lifecycle the memory
watch reads the same tree at least as often and hands its reading over (``note_rss``, through
``DaemonControl.note_memory``): the process then skips its own (issue 35: the supervisor's idle
CPU). Here two processes of a plain ``sleep``, side by side: the one handed readings takes none
of its own while the other goes on taking its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simhelpers import apoll_until, free_tcp_port

from cuzk_supervisor.address import Address
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.process import DaemonProcess
from cuzk_supervisor.daemon.spec import DaemonSettings

MIB = 1 << 20


async def _answers(address: Address, deadline_s: float) -> None:
    """The ready probe of a daemon that is only a sleeping process: ready at once."""


def _sleeper(folder: Path, readings: list[int]) -> DaemonProcess:
    settings = DaemonSettings(
        binary=sys.executable,
        extra_args=("-c", "import time; time.sleep(300)"),
        config_path=folder / "cuzk.toml",
        log_path=folder / "cuzk.log",
        stop_grace_s=5.0,
    )
    values = DaemonConfigValues(
        partition_workers=1, total_budget_gib=89, max_parallel_synthesis=1,
        listen=f"127.0.0.1:{free_tcp_port()}", status_listen=f"127.0.0.1:{free_tcp_port()}",
    )  # fmt: skip

    def read(pid: int) -> int:
        readings.append(pid)
        return MIB

    # A long interval: after its quick first readings (0.05 s, doubling), a reading handed
    # over stands for the rest of the test.
    return DaemonProcess(settings, values, ready_probe=_answers, rss_sampler=read,
                         rss_interval_s=600.0)  # fmt: skip


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


async def _at_least(readings: list[int], count: int) -> bool:
    return len(readings) >= count
