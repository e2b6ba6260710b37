"""Run a supervisor body as PID 1 or as a background process, and leave nothing behind.

Wraps one async body: becomes a child subreaper when not PID 1, reaps orphans, turns SIGTERM,
SIGINT, SIGHUP and SIGQUIT into a cancellation of the body (whose ``finally`` blocks stop the
daemon with its grace period), and on every exit path kills whatever descendants remain. The exit
code is the body's, or 128 + the signal that stopped us.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from cuzk_supervisor import exitcodes, killtree, pid1
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.reaper import Reaper

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class Runtime:
    """What a body gets: the reaper (spawn children through it) and the signal forwarder
    (register children that should hear our stop signals as they are)."""

    reaper: Reaper
    signals: pid1.SignalForwarder
    as_pid1: bool
    subreaper: bool


# A coroutine function: its call is handed to asyncio.create_task.
Body = Callable[[Runtime], Coroutine[Any, Any, int]]


def run_supervised(
    body: Body, *, cleanup_grace_s: float = 5.0, keep_children: Iterable[int] = ()
) -> int:
    """Run ``body`` in a fresh event loop with PID-1 duties; return the process exit code.

    ``keep_children``: children started before (``sim``'s simulated manager) that their starter
    waits for and stops after this returns: never reaped here, spared by the last cleanup.
    """
    return asyncio.run(_supervised(body, cleanup_grace_s, tuple(keep_children)))


async def _supervised(body: Body, cleanup_grace_s: float, keep: tuple[int, ...]) -> int:
    as_pid1 = pid1.is_pid1()
    subreaper = False if as_pid1 else pid1.become_subreaper()
    reaper = Reaper()  # logs each orphan it collects (pid1.orphan_reaped), once
    for pid in keep:
        reaper.own(pid)
    reaper.start()
    # The daemon is not registered with the forwarder: it hangs on SIGINT (cuzk.md §2), so it
    # is stopped by its owner with SIGTERM, a grace period, then SIGKILL, whatever we received.
    signals = pid1.SignalForwarder()
    signals.start()
    log.info("supervisor.started", as_pid1=as_pid1, subreaper=subreaper)
    runtime = Runtime(reaper, signals, as_pid1, subreaper)
    work = asyncio.create_task(body(runtime))
    stop = asyncio.create_task(signals.wait())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
        result = exitcodes.FAILURE
        try:
            result = await work
        except asyncio.CancelledError:
            pass
        except UsageError:
            raise
        except Exception:
            # A bug in the supervisor must still end in cleanup and a non-zero exit, with the
            # traceback in the log rather than a silent dead instance (incident I2).
            log.exception("supervisor.crashed")
        if signals.received is not None:
            log.info("supervisor.stopping", signal=signal.Signals(signals.received).name)
            return pid1.exit_code_for(None, signals.received)
        return result
    finally:
        stop.cancel()
        report = await asyncio.to_thread(killtree.kill_descendants, cleanup_grace_s, spare=keep)
        if report.survivors:
            log.error("supervisor.survivors", pids=report.survivors)
        reaper.reap()
        signals.stop()
        reaper.stop()
