"""PID-1 duties: reap orphans, forward signals, become a child subreaper, clean up, exit codes.

Small and boring on purpose (tini is the model). The supervisor may run as the container's PID 1
or as a background process started by a platform hook (incidents I7); either way it reaps the
orphans its children leave, passes stop signals on, and leaves nothing it started running.
Reaping lives in :mod:`cuzk_supervisor.reaper`, stopping whole process trees in
:mod:`cuzk_supervisor.killtree`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

import structlog

from cuzk_supervisor.exitcodes import SIGNAL_BASE

log = structlog.get_logger("supervisor.pid1")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# What a container runtime or an operator sends to stop us; all four terminate by default.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
)


# --- exit codes --------------------------------------------------------------------------------


def exit_code_for(child_returncode: int | None, signal_received: int | None) -> int:
    """The supervisor's own exit code.

    A signal we received wins (128 + N, the shell convention: 143 for SIGTERM): we were told to
    stop, whatever the child did on its way out. Otherwise the child's code, with a child killed
    by signal N (``returncode == -N``, as subprocess reports it) mapped to 128 + N. No child and
    no signal is 0.
    """
    if signal_received is not None:
        return SIGNAL_BASE + _checked_signal(signal_received)
    if child_returncode is None:
        return 0
    if child_returncode < 0:
        return SIGNAL_BASE + _checked_signal(-child_returncode)
    if child_returncode > 255:
        raise ValueError(f"an exit code is 0..255, got {child_returncode}")
    return child_returncode


def _checked_signal(signum: int) -> int:
    if not 1 <= signum <= 64:
        raise ValueError(f"not a signal number: {signum}")
    return signum


# --- PID 1 and the child subreaper ---------------------------------------------------------------


def is_pid1() -> bool:
    return os.getpid() == 1


def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to us instead of to PID 1 (Linux >= 3.4).

    Needed when we are not PID 1 (started in the background by a platform hook): without it the
    daemon's orphans escape our reaping and our cleanup. Returns False, with the reason logged,
    where it is unavailable.
    """
    libc = _libc()
    if libc is None:
        log.warning("pid1.subreaper_unavailable", reason=f"no prctl on {sys.platform}")
        return False
    # prctl reads its arguments as unsigned longs: pass them at that width.
    if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), *(ctypes.c_ulong(0),) * 3) != 0:
        errno = ctypes.get_errno()
        log.warning("pid1.subreaper_unavailable", reason=os.strerror(errno), errno=errno)
        return False
    log.info("pid1.subreaper", pid=os.getpid())
    return True


def is_subreaper() -> bool | None:
    """Whether this process is a child subreaper; None where that cannot be read."""
    libc = _libc()
    if libc is None:
        return None
    flag = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), *(ctypes.c_ulong(0),) * 3) != 0:
        return None
    return bool(flag.value)


# --- signal forwarding -------------------------------------------------------------------------


class SignalForwarder:
    """Passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to registered children.

    A child that leads its own process group (``start_new_session=True``) gets the signal on
    the whole group, so its own children hear it too; otherwise only the child does. The first
    terminating signal is kept in ``received`` (and released from ``wait()``) so the caller can
    shut down and exit with ``exit_code_for(..., received)``.
    """

    def __init__(
        self, signals: Iterable[int] = FORWARDED_SIGNALS, terminating: Iterable[int] | None = None
    ) -> None:
        self.signals = tuple(signals)
        self.terminating = frozenset(self.signals if terminating is None else terminating)
        self.received: int | None = None
        self._children: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for signum in self.signals:
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def stop(self) -> None:
        if self._loop is not None:
            for signum in self.signals:
                self._loop.remove_signal_handler(signum)
            self._loop = None

    def add(self, pid: int) -> None:
        self._children.add(pid)

    async def wait(self) -> int:
        """Wait for the first terminating signal; returns its number."""
        assert self._stopping is not None, "start() first"
        await self._stopping.wait()
        assert self.received is not None
        return self.received

    def forward(self, signum: int) -> None:
        for pid in sorted(self._children):
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signum)
                else:
                    os.kill(pid, signum)
            except ProcessLookupError:
                self._children.discard(pid)  # gone: nothing to forward to

    def _on_signal(self, signum: int) -> None:
        log.info("pid1.signal", signal=signal.Signals(signum).name, children=len(self._children))
        if signum in self.terminating and self.received is None:
            self.received = signum
            assert self._stopping is not None
            self._stopping.set()
        self.forward(signum)
