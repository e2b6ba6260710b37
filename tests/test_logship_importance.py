"""Issue 43 on virtual time: within the same budget, the dashboard keeps every milestone (a phase,
a report, a child's first, ready, error and last lines) and summarises routine lines by kind;
every line is pushed or counted, once."""

from __future__ import annotations

import asyncio
import re

from logshipfakes import LogManager, shipped

from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.manager.wire import HttpAnswer
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.daemon.spec import READY_LINE

SUMMARY = re.compile(r"^\[([\d,]+) lines not pushed")


def counted(lines: list[str]) -> tuple[list[str], int]:
    """The lines that are not summaries, and what the summaries count."""
    kept, count = [], 0
    for line in lines:
        found = SUMMARY.match(line)
        if found:
            count += int(found.group(1).replace(",", ""))
        else:
            kept.append(line)
    return kept, count


def test_every_phase_goes_beside_a_flood_and_the_rest_is_counted_by_kind():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        for n in range(600):  # ten minutes: a phase a minute among routine lines
            if n % 60 == 0:
                shipper.add_line("setup", f"phase.entered phase=p{n // 60}", milestone=True)
            for k in range(50):
                shipper.add_line("setup", f"proof.completed {n} {k} " + "x" * 80,
                                 kind="proof.completed")  # fmt: skip
            for k in range(200):
                shipper.add_line("benchdaemon", f"INFO {n} {k} " + "y" * 80, kind="daemon INFO")
            await asyncio.sleep(1)

    shipper, fake, _ = shipped(scenario)
    setup, setup_counted = counted(fake.lines("setup"))
    phases = [line for line in setup if line.startswith("phase.entered")]
    assert phases == [f"phase.entered phase=p{n}" for n in range(10)]
    assert len(setup) + setup_counted == 10 + 600 * 50
    daemon, daemon_counted = counted(fake.lines("benchdaemon"))
    assert len(daemon) + daemon_counted == 600 * 200
    assert any("proof.completed" in line for line in fake.lines("setup") if SUMMARY.match(line))
    assert shipper.stats().buffered_lines == 0


def test_a_childs_first_ready_error_and_last_lines_reach_the_dashboard_beside_its_flood():
    written = 0

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        nonlocal written
        pump = OutputPump("cuzk", None)
        pump.add_sink(shipper.child_tab("benchdaemon", "daemon", ready=READY_LINE))
        reader = asyncio.StreamReader()
        task = asyncio.create_task(pump.pump(reader, "stdout"))

        def write(line: str) -> None:
            nonlocal written
            written += 1
            reader.feed_data(line.encode() + b"\n")

        for n in range(12):
            write(f"T  INFO cuzk_daemon: starting step {n}")
        write("T  INFO cuzk_daemon: cuzk-daemon ready, serving on unix:///run/cuzk.sock")
        for second in range(120):
            for n in range(2000):
                write(f"T DEBUG cuzk_core::pipeline: flood {second} {n}")
            if second == 60:
                write("T ERROR cuzk_core::gpu: CUDA error 700")
            await asyncio.sleep(1)
        for n in range(3):
            write(f"T  INFO cuzk_daemon: last words {n}")
        reader.feed_eof()
        await task
        await asyncio.sleep(60)

    _, fake, _ = shipped(scenario, ShipperSettings(child_head_lines=10, child_tail_lines=5))
    lines, summarised = counted(fake.lines("benchdaemon"))
    assert [line for line in lines if "starting step" in line] == [
        f"T  INFO cuzk_daemon: starting step {n}" for n in range(10)
    ]
    assert any("cuzk-daemon ready" in line for line in lines)
    assert "T ERROR cuzk_core::gpu: CUDA error 700" in lines
    assert lines[-5:] == [
        "T DEBUG cuzk_core::pipeline: flood 119 1998",
        "T DEBUG cuzk_core::pipeline: flood 119 1999",
        *(f"T  INFO cuzk_daemon: last words {n}" for n in range(3)),
    ]
    assert len(lines) + summarised == written
    assert any("daemon DEBUG" in line for line in fake.lines("benchdaemon") if SUMMARY.match(line))


def test_a_crash_loop_past_the_budget_keeps_its_first_and_last_exits_and_counts_the_middle():
    settings = ShipperSettings(milestone_backlog_s=60.0)

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        shipper.enter_run_phase(after_s=0)
        for n in range(600):  # an exit every 2 s for 20 minutes: 5 KB a minute, past 2.4
            shipper.add_line("cuzk", f"daemon exited {n:04d}: " + "z" * 150, milestone=True)
            await asyncio.sleep(2)

    _, fake, _ = shipped(scenario, settings)
    lines, summarised = counted(fake.lines("cuzk"))
    numbers = [int(line.split()[2].rstrip(":")) for line in lines]
    assert numbers == sorted(numbers)
    assert numbers[0] == 0  # the first exit
    assert numbers[-1] == 599  # and the last
    assert summarised > 0  # the middle of the loop, counted
    assert len(lines) + summarised == 600


def test_a_body_the_manager_rejects_counts_the_lines_its_summary_stood_for():
    """A JSON 400 to a push that carries a summary: the lines it stood for are rejected too
    (counted in ``rejected_lines``), not gone from every count."""

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        for k in range(2_000):  # past one turn's budget: most are summarised
            shipper.add_line("benchdaemon", f"INFO {k} " + "y" * 80, kind="daemon INFO")
        fake.answer = lambda _: HttpAnswer.of_json(400, {"error": "bad request: test"})
        await asyncio.wait_for(fake.attempted.wait(), 120)  # the next turn's push, rejected

    shipper, fake, _ = shipped(scenario)
    stats = shipper.stats()
    assert fake.pushes == []
    assert stats.rejected_lines == 2_000
