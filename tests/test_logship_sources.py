"""The log shipper's sources on virtual time: lines from another thread, structlog events under
the supervisor's own tab, a daemon's lines once under theirs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import structlog
from logshipfakes import LogManager, shipped

from cuzk_supervisor.adapters.logship.lines import shipping_processor
from cuzk_supervisor.adapters.logship.shipper import LogShipper


def test_add_line_from_another_thread():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        def add_two() -> None:
            for n in range(2):
                shipper.add_line("setup", f"t{n}")

        worker = threading.Thread(target=add_two)
        worker.start()
        worker.join()
        await asyncio.sleep(25)

    _, fake, _ = shipped(scenario)
    assert fake.lines() == ["t0", "t1"]


def _with_processor(shipper: LogShipper) -> dict[str, Any]:
    old = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            shipping_processor(shipper),
            structlog.processors.KeyValueRenderer(),
        ],
        logger_factory=structlog.ReturnLoggerFactory(),
    )
    return old


def test_structlog_events_are_shipped_as_supervisor_lines():
    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        old = _with_processor(shipper)
        try:
            structlog.get_logger().info("daemon.ready", calls=3)
        finally:
            structlog.configure(**old)
        await asyncio.sleep(25)

    _, fake, _ = shipped(scenario)
    assert fake.lines("setup") == ["info daemon.ready calls=3"]


def test_a_daemon_line_is_shipped_once_under_its_own_tab():
    """Before issue 22 every daemon line went twice: raw under its tab, and again as a
    ``child.line`` event under ``setup``."""
    from cuzk_supervisor.daemon.output import OutputPump

    async def scenario(shipper: LogShipper, fake: LogManager) -> None:
        old = _with_processor(shipper)
        try:
            pump = OutputPump("cuzk", None)
            pump.add_listener(shipper.listener("cuzk"))
            reader = asyncio.StreamReader()
            reader.feed_data(b"\x1b[32mready\x1b[0m\nproving 1\n")
            reader.feed_eof()
            await pump.pump(reader, "stdout")
            structlog.get_logger().info("daemon.ready")
        finally:
            structlog.configure(**old)
        await asyncio.sleep(25)

    _, fake, _ = shipped(scenario)
    assert fake.lines("cuzk") == ["ready", "proving 1"]
    assert fake.lines("setup") == ["info daemon.ready"]
