"""Worker commands (e.g. a curio node) kept up beside the daemon in the run phase.

A ``CommandProcess`` has the same shape as ``DaemonProcess`` (start, wait, stop, pid), so the
same ``DaemonKeeper`` restarts it with the same policy; only readiness differs (a command is
ready once it is running).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import structlog

from cuzk_supervisor import killtree
from cuzk_supervisor.core.exits import DaemonExit, ExitFacts, ExitKind, classify_exit
from cuzk_supervisor.daemon import leftovers
from cuzk_supervisor.daemon.childenv import child_environ
from cuzk_supervisor.daemon.output import LineSink, OutputPump
from cuzk_supervisor.daemon.process import DaemonStartFailed, Spawner
from cuzk_supervisor.deadline import within

log = structlog.get_logger()


class CommandProcess:
    """One run of a shell command in its own process group, output carried line by line."""

    def __init__(
        self,
        command: str,
        *,
        source: str,
        stop_grace_s: float,
        spawn: Spawner = asyncio.create_subprocess_exec,
        line_sink: LineSink | None = None,
        pid_dir: Path | None = None,
    ) -> None:
        self.command = command
        self.role = f"worker:{source}:{command}"
        """Its mark (:mod:`cuzk_supervisor.daemon.leftovers`): a copy a killed supervisor left is
        stopped before this one starts."""
        self.pidfile = pid_dir / f"worker-{source}.pid" if pid_dir is not None else None
        self.source = source
        self.stop_grace_s = stop_grace_s
        self._spawn = spawn
        self._sink = line_sink
        self._proc: asyncio.subprocess.Process | None = None
        self._pump = OutputPump(source, None)
        self._reader: asyncio.Task[None] | None = None
        self._stop_requested = False
        self._started_at = 0.0
        self._exit: DaemonExit | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        if self._sink is not None:
            self._pump.add_sink(self._sink)
        await asyncio.to_thread(leftovers.reclaim, self.role, self.pidfile, self.stop_grace_s)
        try:
            self._proc = await self._spawn(
                "/bin/sh", "-c", self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=child_environ(leftovers.env_marks(self.role)),
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            self._exit = DaemonExit(
                ExitKind.FAILED_TO_START, f"cannot run /bin/sh: {exc}", permanent=True
            )
            raise DaemonStartFailed(self._exit) from None
        self._started_at = time.monotonic()
        if self.pidfile is not None:
            await asyncio.to_thread(leftovers.record, self.pidfile, self._proc.pid)
        assert self._proc.stdout is not None
        self._reader = asyncio.create_task(self._pump.pump(self._proc.stdout, "stdout"))
        log.info("worker.started", source=self.source, pid=self._proc.pid, command=self.command)

    async def wait(self) -> DaemonExit:
        if self._exit is not None:
            return self._exit
        assert self._proc is not None
        returncode = await self._proc.wait()
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=1.0)
            self._reader.cancel()
        self._exit = classify_exit(
            ExitFacts(
                returncode=returncode,
                was_ready=True,  # running is all a command has to do
                stop_requested=self._stop_requested,
                last_lines=tuple(self._pump.tail),
                uptime_s=time.monotonic() - self._started_at,
            )
        )
        log.warning("worker.exited", source=self.source, **self._exit.as_fields())
        return self._exit

    async def stop(self) -> DaemonExit:
        if self._proc is None:
            return self._exit or DaemonExit(ExitKind.FAILED_TO_START, "never started")
        if self._proc.returncode is None:
            self._stop_requested = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                await within(asyncio.shield(self._proc.wait()), self.stop_grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
        result = await self.wait()
        await asyncio.to_thread(killtree.kill_tree, [self._proc.pid], 0.0, 1.0)
        if self.pidfile is not None:
            leftovers.forget(self.pidfile)
        return result
