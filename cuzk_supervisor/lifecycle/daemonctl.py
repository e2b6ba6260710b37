"""Daemon control: start the daemon, replace it with new config values, wait until it answers,
stop it; and, in the run phase, keep the worker commands up beside it.

The shell around :class:`~cuzk_supervisor.daemon.keeper.DaemonKeeper`. A daemon exit is told through
the shared ``Signals`` (an OOM kill is memory trouble) and ``Progress`` (the last failure); a keeper
that gave up (cannot start, crash-loops) is a :class:`LifecycleFailure` with its exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.core.exits import DaemonExit, ExitKind
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.plan import WorkerPlan, total_budget_gib
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.keeper import DaemonKeeper, KeeperOutcome
from cuzk_supervisor.daemon.keepers import KeeperRecipe, config_values, daemon_keeper, worker_keeper
from cuzk_supervisor.daemon.process import Spawner
from cuzk_supervisor.daemon.spec import READY_LINE
from cuzk_supervisor.deadline import within
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, Progress, Signals
from cuzk_supervisor.serve.metricsink import MetricsSink

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.machine.resources import MemorySnapshot


@dataclass(eq=False)
class DaemonControl:
    """The one daemon of this instance, and its worker commands."""

    recipe: KeeperRecipe
    _: KW_ONLY
    spawn: Spawner
    watch: MemoryWatch
    metrics: MetricsSink
    shipper: LogShipper
    signals: Signals
    progress: Progress
    memory_policy: MemoryPolicy
    keeper: DaemonKeeper | None = field(default=None, init=False)
    _task: asyncio.Task[KeeperOutcome] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._tab = self.shipper.child_tab("benchdaemon", "daemon", ready=READY_LINE)

    @property
    def source(self) -> str:
        """The dashboard tab the daemon's lines go to: benchdaemon until the bench is reported,
        then cuzk."""
        return self._tab.source

    @source.setter
    def source(self, source: str) -> None:
        self._tab.source = source

    # --- what the others read ---------------------------------------------------------------

    @property
    def workers(self) -> int | None:
        """The partition workers the daemon runs with; None before it was first started."""
        return self.keeper.values.partition_workers if self.keeper is not None else None

    @property
    def restarts(self) -> int:
        return max(0, (self.keeper.starts - 1) if self.keeper else 0)

    @property
    def ended(self) -> asyncio.Future[KeeperOutcome]:
        """Done when the keeper gave up on the daemon (its outcome) or was stopped."""
        assert self._task is not None, "the daemon was not started"
        return self._task

    def pid(self) -> int | None:
        current = self.keeper.current if self.keeper else None
        return current.pid if current is not None else None

    def note_memory(self, snapshot: MemorySnapshot | None) -> None:
        """The memory watch's reading of the running daemon's tree counts toward its peak RSS
        (and spares the daemon process its own reading: ``DaemonProcess.note_rss``)."""
        if self.keeper is None or snapshot is None or snapshot.daemon_pid is None:
            return
        if snapshot.daemon_pid == self.pid():
            self.keeper.note_rss(snapshot.daemon_rss)

    def note_answer(self) -> None:
        """The daemon answered a call of the health watch's: its liveness probe is spared."""
        if self.keeper is not None:
            self.keeper.note_answer()

    # --- control ----------------------------------------------------------------------------

    async def start(self, plan: WorkerPlan, workers: int) -> None:
        """Start the daemon with ``workers`` (or replace it, if it runs with another count) and
        wait until it answers."""
        if self.keeper is None:
            self.keeper = daemon_keeper(
                self.recipe, self._values(plan, workers), spawn=self.spawn,
                memory_at_limit=self.watch.at_limit, line_sinks=(self._tab,),
            )  # fmt: skip
            self.keeper.add_exit_listener(self._on_exit)
            self._task = asyncio.create_task(self.keeper.run())
        elif self.keeper.values.partition_workers != workers:
            self.keeper.restart_with(self._values(plan, workers))
        await self.ready()

    async def replace(self, plan: WorkerPlan, workers: int) -> None:
        """Stop the daemon and start it again with ``workers`` (not a failure); wait for it."""
        assert self.keeper is not None
        self.keeper.restart_with(self._values(plan, workers))
        await self.ready()

    def forget_failures(self) -> None:
        """A new plan is a new configuration: its failures are counted afresh."""
        if self.keeper is not None:
            self.keeper.forget_failures()

    async def ready(self) -> None:
        """Wait until the daemon answers; a keeper that gives up first is the lifecycle's end."""
        assert self.keeper is not None
        assert self._task is not None
        ready = asyncio.create_task(self.keeper.wait_ready())
        done, _ = await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            outcome = self._task.result()
            raise LifecycleFailure(outcome.exit_code, f"daemon: {outcome.reason}")
        self.watch.mark_base()  # ready and idle: the base a memory fit is measured over

    async def stop(self) -> None:
        if self.keeper is not None and self._task is not None:
            await self.keeper.stop()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)

    @asynccontextmanager
    async def workers_kept(self) -> AsyncIterator[None]:
        """Keep the worker commands up while the body runs. Plain tasks, not a TaskGroup: a
        verdict raised in the body (out of memory, a crash loop) must reach the phase machine as
        itself, not wrapped in a group."""
        keepers = [self._worker_keeper(i, cmd) for i, cmd in enumerate(self.recipe.worker_commands)]
        tasks = [asyncio.create_task(self._keep_worker(keeper)) for keeper in keepers]
        try:
            yield
        finally:
            for keeper in keepers:
                await keeper.stop()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await within(task, self.recipe.spec.stop_grace_s + 5)

    # --- inside -----------------------------------------------------------------------------

    def _values(self, plan: WorkerPlan, workers: int) -> DaemonConfigValues:
        budget = total_budget_gib(workers, plan.limit, self.memory_policy)
        return config_values(self.recipe, partition_workers=workers, total_budget_gib=budget,
                             max_parallel_synthesis=workers)  # fmt: skip

    def _on_exit(self, exit: DaemonExit) -> None:
        self.metrics.daemon_exit(exit.kind)
        self.progress.last_failure = f"daemon {exit.kind.value}: {exit.reason}"
        self.signals.daemon_exit(f"daemon {exit.kind.value} ({exit.reason})")
        self._tab.note(f"[cuzk-supervisor] daemon exited: {exit.kind.value} ({exit.reason})")
        if exit.kind is ExitKind.OOM_KILLED:
            self.signals.flag_trouble(f"daemon OOM-killed ({exit.reason})", daemon_running=False)

    def _worker_keeper(self, index: int, command: str) -> DaemonKeeper:
        source = "curio" if index == 0 else f"worker{index}"
        assert self.keeper is not None
        return worker_keeper(self.recipe, self.keeper, command, source=source, spawn=self.spawn,
                             line_sink=self.shipper.child_tab(source, source))  # fmt: skip

    async def _keep_worker(self, keeper: DaemonKeeper) -> None:
        """A worker that crash-loops is given up on (logged and shipped); proving goes on."""
        outcome = await keeper.run()
        if outcome.exit_code:
            self.shipper.add_line(
                "setup", f"{keeper.name} stopped: {outcome.reason}", milestone=True
            )
