"""Run a supervisor body as PID 1 or as a background process, and leave nothing behind.

Wraps one async body: becomes a child subreaper when not PID 1, reaps orphans, turns SIGTERM,
SIGINT, SIGHUP and SIGQUIT into a cancellation of the body (whose ``finally`` blocks stop the
daemon with its grace period), and on every exit path kills whatever descendants remain. The exit
code is the body's, or 128 + the signal that stopped us.

``end_settled`` ends the process afterwards without the interpreter's teardown (about 0.1 s after
the last log line: module cleanup, the collection of the whole heap, the C libraries' own exit
work, grpc's after a used channel), once nothing is left to settle.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import io
import logging
import os
import signal
import sys
import threading
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
    """What a body gets: the reaper (spawn children through it)."""

    reaper: Reaper


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
    # The daemon is not registered with the forwarder: it hangs on SIGINT (docs/daemon.md), so it
    # is stopped by its owner with SIGTERM, a grace period, then SIGKILL, whatever we received.
    signals = pid1.SignalForwarder()
    signals.start()
    log.info("supervisor.started", as_pid1=as_pid1, subreaper=subreaper)
    work = asyncio.create_task(body(Runtime(reaper)))
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


def unsettled() -> str | None:
    """What still runs that the interpreter's teardown would wait for or tidy, or None: another
    thread (a writer the teardown would join), or a child process, running or not yet reaped."""
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"threads still running: {', '.join(others)}"
    if child_left():
        return "a child process is left"
    return None


def child_left() -> bool:
    """Whether this process has a child, running or a zombie (looked at with ``WNOWAIT``)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False  # no child at all
    return True


def flush_files() -> None:
    """Flush what the teardown would: stdout and stderr, the logging handlers, then every open
    Python file with a write buffer (found through the garbage collector, as its finaliser would
    be at teardown). A file that cannot be flushed (a closed pipe) is skipped, as at teardown."""
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    logging.shutdown()
    for obj in gc.get_objects():
        if isinstance(obj, _WRITE_BUFFERED):
            _flush(obj)


# The C classes of the files with a write buffer (a concrete class is a quick isinstance).
_WRITE_BUFFERED = (io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)


def _flush(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if stream is not None and not stream.closed and stream.writable():
            stream.flush()


def end_settled(code: int) -> None:
    """End the process with ``code`` now, without the interpreter's teardown (see the module),
    if nothing is left to settle (``unsettled``); else return, and the caller exits as usual.

    Only for the very end of a command (``run``, ``sim``): the lifecycle's loop has closed, so the
    state file is written and fsynced, the log shipper drained or given up and the children
    reaped (``run_supervised``). The exit callbacks run as at any exit (``atexit``: logging's
    shutdown, the terminal view's tidy-up, weakref finalisers), then every file is flushed."""
    if unsettled() is not None:
        return
    atexit._run_exitfuncs()
    flush_files()
    os._exit(code)
