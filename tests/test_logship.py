"""The log shipper against a scripted manager on virtual time (``cuzk_supervisor.sim.vtime``):
minutes of pushes run in milliseconds, and the budget's figures are checked on the clock the
shipper itself reads, never on how fast the machine is. Nothing sleeps to synchronise. (Its pure
pieces: test_logship_wire.py.)
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from logshipfakes import KB, LogManager, away, chatty, nginx_404, shipped

from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.manager.wire import HttpAnswer


def test_lines_go_per_source_in_order_the_supervisors_tab_first():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        for n in range(5):
            shipper.add_line("cuzk", f"cuzk {n}")
            shipper.add_line("setup", f"setup {n}")
        await asyncio.sleep(25)  # one turn (20 s, jittered)

    _, fake, _ = shipped(scenario)
    assert [source for _, source, _ in fake.pushes] == ["setup", "cuzk"]
    assert fake.lines("setup") == [f"setup {n}" for n in range(5)]
    assert fake.lines("cuzk") == [f"cuzk {n}" for n in range(5)]


def test_a_line_waits_at_most_one_turn_so_the_dashboard_moves_every_30_s():
    async def scenario(shipper: LogShipper, fake: LogManager) -> list[float]:
        waits = []
        loop = asyncio.get_running_loop()
        for n in range(30):
            at = loop.time()
            shipper.add_line("setup", f"status {n}")
            fake.pushed.clear()
            await fake.pushed.wait()
            waits.append(loop.time() - at)
        return waits

    _, _, waits = shipped(scenario)
    assert max(waits) <= 20 * 1.2 + 0.5  # a turn every 20 s +- 20 %


@pytest.mark.parametrize(("run_phase", "per_min", "kb_per_min"), [(False, 4, 12), (True, 1, 2.4)])
def test_a_chatty_child_costs_the_budget_whatever_it_writes(run_phase, per_min, kb_per_min):
    """1,000 lines a second for 10 minutes, in the run phase or before it: the pushes stay in
    the phase's budget, the newest lines go, and one line counts those left out."""

    async def scenario(shipper: LogShipper, fake: LogManager) -> tuple[float, float]:
        if run_phase:
            shipper.enter_run_phase(after_s=0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await chatty(shipper, "benchdaemon", 1000, 600)
        return started, loop.time()

    shipper, fake, (started, ended) = shipped(scenario)
    within = [p for p in fake.pushes if started <= p[0] <= ended]
    minutes = (ended - started) / 60
    budget = shipper.budget
    final = shipper.config
    # The phase's rate, one burst, and the last turn when the shipper stops.
    assert len(within) <= per_min * minutes + budget.burst_requests + final.final_requests
    sent = sum(len(line) + 1 for p in within for line in p[2])
    assert sent <= kb_per_min * KB * minutes + budget.burst_bytes + final.final_bytes + 200
    assert sent / minutes / KB >= kb_per_min * 0.8  # and it is used: the newest lines go
    assert all(p[2][0].startswith("[") and "lines not pushed" in p[2][0] for p in within[1:])
    stats = shipper.stats()
    assert stats.skipped_total + stats.dropped_total > 500_000
    # The newest lines went: each push ends with a line written shortly before it.
    last = int(within[-1][2][-1].split()[2])
    assert last > 1000 * (ended - started) - 1000 * 130


def test_a_failed_push_never_brings_the_next_one_sooner():
    """Ten minutes of a proxy's 404 page for every push: no more attempts than the budget
    allows, and no request at all while the shared backoff holds them back."""

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        fake.answer = nginx_404
        await chatty(shipper, "setup", 50, 600)

    shipper, fake, _ = shipped(scenario)
    assert fake.pushes == []
    assert len(fake.attempts) <= 4 * 10 + 2 + 2  # the budget, its burst, the last turn
    assert shipper.stats().failed_pushes == len(fake.attempts)


def test_the_last_turn_is_one_bounded_flush_never_a_loop():
    """The storm of issue 31: an instance ending while a proxy answered 404 pages sent 111
    pushes in 5 s. The exit's turn: at most ``final_requests`` pushes, one attempt each."""

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        fake.answer = nginx_404
        for n in range(10_000):
            shipper.add_line("cuzk" if n % 2 else "setup", f"line {n}")

    shipper, fake, _ = shipped(scenario, uuid="u-1")
    assert len(fake.attempts) <= 2  # one failed push at start, one in the last turn: it stops
    stats = shipper.stats()
    assert stats.buffered_lines > 0  # kept, not sent in a loop


def test_the_last_turn_sends_the_supervisors_reason_first():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        await asyncio.sleep(1)
        for n in range(3000):
            shipper.add_line("cuzk", f"daemon {n}")
        shipper.add_line("setup", "instance gone in run: manually killed via UI")

    _, fake, _ = shipped(scenario)
    assert fake.pushes[0][1] == "setup"
    assert fake.lines("setup") == ["instance gone in run: manually killed via UI"]
    assert fake.lines("cuzk")[-1] == "daemon 2999"
    assert fake.lines("cuzk")[0].startswith("[")  # the count of those left out
    assert len(fake.pushes) <= 2


def test_a_flush_through_a_reason_sends_every_milestone_before_it_then_stops():
    """The reason told before /bench-done waits behind more milestones of the supervisor's tab
    than one turn carries (a crash loop's events): the flush goes on, turn after turn, until
    the reason was taken, and no further."""
    settings = ShipperSettings(final_requests=1, final_bytes=2000)

    async def scenario(shipper: LogShipper, fake: LogManager) -> tuple[bool, int]:
        shipper.enter_run_phase(after_s=0)
        await asyncio.sleep(1)
        for n in range(100):  # ~6 KB of milestones: three turns' worth
            shipper.add_line("setup", f"daemon.exited n={n:03d} " + "x" * 40, milestone=True)
        seq = shipper.add_line("setup", "health: broken: the daemon crash-loops", milestone=True)
        shipper.add_line("setup", "after the reason", milestone=True)
        taken = await shipper.flush(30.0, through=seq)
        return taken, len(fake.pushes)

    _, fake, (taken, pushes) = shipped(scenario, settings)
    assert taken
    assert pushes >= 3  # more than one turn
    setup = fake.lines("setup")
    reason = setup.index("health: broken: the daemon crash-loops")
    assert setup[:reason] == [f"daemon.exited n={n:03d} " + "x" * 40 for n in range(100)]


@pytest.mark.parametrize("tabs_with_lines", [4, 1])
def test_the_last_turn_counts_a_tab_it_has_no_room_for(tabs_with_lines):
    """At the stop, the supervisor's milestones fill the last turn's bytes (or its one tab with
    lines); a quiet tab's one waiting line gets no room of it. It still goes as a count: every
    line written is pushed or counted, and nothing is left unsent."""
    settings = ShipperSettings(final_bytes=2000, final_requests=tabs_with_lines)

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        await asyncio.sleep(1)
        for n in range(5):
            shipper.add_line("benchdaemon", f"daemon {n}")
        await asyncio.sleep(25)  # a turn: those go
        for n in range(60):
            shipper.add_line("setup", f"phase.entered n={n:02d} " + "x" * 40, milestone=True)
        shipper.add_line("benchdaemon", "the daemon's last line")

    shipper, fake, _ = shipped(scenario, settings)
    counted = sum(
        int(line.split(" ", 1)[0].strip("[").replace(",", ""))
        for line in fake.lines("benchdaemon")
        if line.startswith("[")
    )
    sent = [line for line in fake.lines("benchdaemon") if not line.startswith("[")]
    assert len(sent) + counted == 6
    assert shipper.unsent() == {}


def test_weather_keeps_the_lines_and_they_go_when_it_clears():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        fake.answer = nginx_404
        for n in range(5):
            shipper.add_line("setup", f"status {n}")
            await asyncio.sleep(60)
        fake.answer = lambda _: HttpAnswer(204)
        await asyncio.sleep(60)

    _, fake, _ = shipped(scenario)
    assert fake.lines("setup") == [f"status {n}" for n in range(5)]


def test_an_outage_keeps_the_newest_lines_and_counts_the_rest():
    settings = ShipperSettings(max_buffer_lines=100)

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        fake.answer = away
        for n in range(250):
            shipper.add_line("cuzk", f"line {n}")
        await asyncio.sleep(120)
        fake.answer = lambda _: HttpAnswer(204)
        await asyncio.sleep(60)

    shipper, fake, _ = shipped(scenario, settings)
    lines = fake.lines("cuzk")
    assert lines[0].startswith("[150 lines not pushed")
    assert lines[1:] == [f"line {n}" for n in range(150, 250)]
    assert shipper.stats().dropped_total == 150


def test_a_long_line_is_cut_with_a_marker():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        shipper.add_line("cuzk", "y" * 400_000)
        await asyncio.sleep(25)

    _, fake, _ = shipped(scenario)
    (line,) = fake.lines("cuzk")
    assert len(line.encode()) <= 2000
    assert line.startswith("y" * 1000)
    assert "truncated" in line


def test_lines_wait_for_the_uuid():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        shipper.add_line("setup", "before register")
        await asyncio.sleep(60)
        assert fake.pushes == []
        shipper.set_uuid("u-1")
        await asyncio.sleep(25)

    _, fake, _ = shipped(scenario, uuid=None)
    assert fake.lines() == ["before register"]


def test_stop_flushes_what_is_left():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        await asyncio.sleep(1)
        shipper.add_line("cuzk", "last words")

    _, fake, _ = shipped(scenario)
    assert fake.lines() == ["last words"]


def test_add_line_never_waits_for_a_stuck_manager():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        fake.gate = asyncio.Event()  # every push hangs until the gate opens
        shipper.add_line("cuzk", "first")
        await fake.attempted.wait()
        for n in range(20_000):  # the pusher is stuck on the gate; add_line returns regardless
            shipper.add_line("cuzk", f"flood {n}")
        stats = shipper.stats()
        assert stats.buffered_lines == 10_000  # bounded while the push is stuck
        assert stats.dropped_total == 10_000
        assert len(fake.attempts) == 1
        fake.gate.set()

    _, fake, _ = shipped(scenario)
    assert fake.lines("cuzk")[0] == "first"


def test_the_run_phase_turns_every_log_push_interval():
    settings = ShipperSettings(run_interval_s=120.0)

    async def scenario(shipper: LogShipper, fake: LogManager) -> list[float]:
        shipper.enter_run_phase()  # after one more turn at 20 s
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 1200:
            shipper.add_line("setup", "status")
            await asyncio.sleep(30)
        return [at - started for at, _, _ in fake.pushes]

    _, _, times = shipped(scenario, settings)
    # After the switch's own turn and the first one at the new interval (anywhere in it).
    gaps = [b - a for a, b in itertools.pairwise(times[3:])]
    assert all(120 * 0.8 - 1 <= gap <= 120 * 1.2 + 1 for gap in gaps)
    assert len(times) <= 2 + 1200 / 96 + 1


def test_a_flush_pushes_the_supervisors_reason_first_and_says_whether_it_was_taken():
    """A reason that must reach the manager before a report (the run phase's health watch):
    one turn out of turn, the ``setup`` tab first; True when the manager took it, even with a
    chatty tab's older lines left out; False when it did not."""

    async def scenario(shipper: LogShipper, fake: LogManager) -> tuple[bool, bool]:
        shipper.enter_run_phase(after_s=0)
        await asyncio.sleep(1)
        for n in range(5000):
            shipper.add_line("cuzk", f"daemon {n}")
        shipper.add_line("setup", "health: GPU 0 fell off the bus")
        taken = await shipper.flush(30.0)
        fake.answer = nginx_404
        shipper.add_line("setup", "health: again")
        refused = await shipper.flush(30.0)
        fake.answer = lambda _: HttpAnswer(204)
        return taken, refused

    _, fake, (taken, refused) = shipped(scenario)
    assert (taken, refused) == (True, False)
    assert fake.lines("setup")[0] == "health: GPU 0 fell off the bus"
