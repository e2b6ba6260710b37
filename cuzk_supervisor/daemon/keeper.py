"""Keep the daemon up: start it, wait for its exit, ask the restart policy, start it again.

The machinery only; every decision (how long to back off, when it is a crash loop) is
``core.restart.next_restart``. Each exit is logged and handed to listeners (metrics, the step-down).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from cuzk_supervisor import exitcodes
from cuzk_supervisor.core.exits import DaemonExit
from cuzk_supervisor.core.restart import (
    GiveUp,
    RestartHistory,
    RestartPolicy,
    next_restart,
    record_failure,
    record_healthy,
)
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.process import DaemonProcess, DaemonSettings, DaemonStartFailed
from cuzk_supervisor.deadline import within

log = structlog.get_logger()


class SupervisedProcess(Protocol):
    """One run of a child: ``DaemonProcess`` or ``workers.CommandProcess``."""

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    async def wait(self) -> DaemonExit: ...

    async def stop(self) -> DaemonExit: ...


ProcessFactory = Callable[[DaemonSettings, DaemonConfigValues], SupervisedProcess]
ExitListener = Callable[[DaemonExit], None]


@dataclass(frozen=True, slots=True)
class KeeperOutcome:
    """Why the keeper stopped keeping the daemon up."""

    exit_code: int
    reason: str


class DaemonKeeper:
    """Owns the daemon for as long as ``run()`` runs; ``stop()`` ends it cleanly."""

    def __init__(
        self,
        settings: DaemonSettings,
        values: DaemonConfigValues,
        policy: RestartPolicy,
        *,
        process_factory: ProcessFactory = DaemonProcess,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        name: str = "daemon",
    ) -> None:
        self.spec = settings
        self.values = values
        self.policy = policy
        self._factory = process_factory
        self.name = name  # "daemon", or a worker command's source (curio, worker1, ...)
        # The daemon's events are daemon.*; a worker command's are worker.* with worker=<name>.
        self._worker_log = None if name == "daemon" else log.bind(worker=name)
        self._clock = clock
        self._rand = rand
        self.history = RestartHistory()
        self.current: SupervisedProcess | None = None
        self.exits_by_kind: Counter[str] = Counter()
        self.starts = 0
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._replan = asyncio.Event()
        self._listeners: list[ExitListener] = []

    def add_exit_listener(self, listener: ExitListener) -> None:
        self._listeners.append(listener)

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def run(self) -> KeeperOutcome:
        """Keep the daemon up until ``stop()``, a permanent start failure or a crash loop."""
        try:
            return await self._run()
        finally:
            await self._stop_current()

    async def _run(self) -> KeeperOutcome:
        while not self._stopping.is_set():
            exit = await self._one_run()
            if self._stopping.is_set():
                break
            if exit is None:  # replaced on purpose (new plan): not a failure
                continue
            self.exits_by_kind[exit.kind.value] += 1
            for listener in self._listeners:
                listener(exit)
            if exit.permanent:
                if self._worker_log is None:
                    log.error("daemon.start_failed", **exit.as_fields())
                else:
                    self._worker_log.error("worker.start_failed", **exit.as_fields())
                return KeeperOutcome(exitcodes.DAEMON_FAILED_TO_START, exit.reason)
            now = self._clock()
            self.history = record_failure(self.policy, self.history, now, exit.reason)
            decision = next_restart(self.policy, self.history, now, self._rand())
            if isinstance(decision, GiveUp):
                if self._worker_log is None:
                    log.error("daemon.crash_loop", verdict=decision.describe(), **exit.as_fields())
                else:
                    self._worker_log.error(
                        "worker.crash_loop", verdict=decision.describe(), **exit.as_fields()
                    )
                return KeeperOutcome(exitcodes.DAEMON_CRASH_LOOP, decision.describe())
            delay = {"delay_s": round(decision.delay_s, 3), "attempt": decision.attempt}
            if self._worker_log is None:
                log.warning("daemon.restart_scheduled", **delay, reason=decision.reason)
            else:
                self._worker_log.warning(
                    "worker.restart_scheduled", **delay, reason=decision.reason
                )
            with contextlib.suppress(TimeoutError):
                await within(self._stopping.wait(), decision.delay_s)
        return KeeperOutcome(exitcodes.OK, "stopped")

    async def _one_run(self) -> DaemonExit | None:
        """Start the daemon and wait for its exit; None when we replaced it ourselves."""
        # Values set by restart_with() during a backoff are used now; no replacement is due.
        self._replan.clear()
        process = self._factory(self.spec, self.values)
        self.current = process
        self.starts += 1
        try:
            await process.start()
        except DaemonStartFailed as failed:
            return failed.exit
        self.history = record_healthy(self.history, self._clock())
        self._ready.set()
        waiter = asyncio.create_task(process.wait())
        replan = asyncio.create_task(self._replan.wait())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({waiter, replan, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._ready.clear()
            replan.cancel()
            stopping.cancel()
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        result = await process.stop()
        if self._replan.is_set():
            self._replan.clear()
            if self._worker_log is None:
                log.info("daemon.replaced", workers=self.values.partition_workers)
            else:
                self._worker_log.info("worker.replaced", workers=self.values.partition_workers)
            return None
        return result

    def note_rss(self, rss_bytes: int | None) -> None:
        """A reading of the daemon tree's RSS taken elsewhere (the memory watch, which samples
        faster while proving): it counts toward the running daemon's ``peak_rss_bytes``."""
        note = getattr(self.current, "note_rss", None)  # DaemonProcess has it; commands not
        if note is not None:
            note(rss_bytes)

    def note_answer(self) -> None:
        """The running daemon answered a call made elsewhere (``DaemonProcess.note_answer``)."""
        note = getattr(self.current, "note_answer", None)  # DaemonProcess has it; commands not
        if note is not None:
            note()

    def forget_failures(self) -> None:
        """Start the crash-loop count afresh (after a deliberate change of configuration)."""
        self.history = RestartHistory()

    def restart_with(self, values: DaemonConfigValues) -> None:
        """Stop the running daemon and start it again with ``values`` (not a failure)."""
        self.values = values
        self._ready.clear()  # wait_ready() from now on waits for the new daemon
        self._replan.set()

    async def stop(self) -> None:
        self._stopping.set()

    async def _stop_current(self) -> None:
        if self.current is not None and self.current.pid is not None:
            await asyncio.shield(self.current.stop())
        self._ready.clear()
