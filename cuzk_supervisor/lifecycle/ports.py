"""What the phase machine is given: one protocol per collaborator.

The real ones are built in the composition root (:mod:`cuzk_supervisor.compose`); tests give
fakes. Each protocol is only what the phase machine calls: a collaborator may do more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from cuzk_supervisor.adapters.machine.gpu import GpuDevice
from cuzk_supervisor.adapters.machine.resources import MemorySnapshot
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.params import ExpectedFile
from cuzk_supervisor.adapters.proving.results import ProofResult
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.core.bench import BenchPolicy, Stretch
from cuzk_supervisor.core.memfit import MemoryFit
from cuzk_supervisor.core.plan import WorkerPlan
from cuzk_supervisor.daemon.keeper import DaemonKeeper, KeeperOutcome


class Daemon(Protocol):
    """Daemon control (:class:`~cuzk_supervisor.lifecycle.daemonctl.DaemonControl`)."""

    keeper: DaemonKeeper | None
    source: str

    @property
    def workers(self) -> int | None: ...

    @property
    def ended(self) -> asyncio.Future[KeeperOutcome]: ...

    async def start(self, plan: WorkerPlan, workers: int) -> None: ...

    async def replace(self, plan: WorkerPlan, workers: int) -> None: ...

    async def stop(self) -> None: ...

    def workers_kept(self) -> AbstractAsyncContextManager[None]: ...


class Proofs(Protocol):
    """Proof attempts (:class:`~cuzk_supervisor.lifecycle.proofs.ProofRunner`)."""

    async def prove(self, budget_s: float) -> ProofResult: ...

    async def stretch(
        self, policy: BenchPolicy, workers: int, deadline: Callable[[], float]
    ) -> Stretch: ...

    def release_input(self) -> None:
        """Drop the proof input held between proofs (none is sent in the run phase)."""


class StepDowns(Protocol):
    """Memory trouble acted on (:class:`~cuzk_supervisor.lifecycle.stepdown.StepDown`)."""

    async def next_plan(
        self, plan: WorkerPlan, cause: str
    ) -> tuple[WorkerPlan, MemoryFit | None]: ...

    async def relaunch(self, plan: WorkerPlan, fit: MemoryFit | None) -> None: ...


class Reports(Protocol):
    """Manager reporting (:class:`~cuzk_supervisor.lifecycle.reporting.Reporter`)."""

    outbox: Outbox
    reported: bool
    min_rate: float

    @property
    def judged(self) -> bool: ...

    async def resend(self) -> None: ...

    async def register(self) -> None: ...

    async def params_done(self) -> None: ...

    def answered_bench(self) -> Report | None: ...

    def verdict_fields(self, report: Report) -> dict[str, Any]: ...

    def bench_deadline(self) -> float: ...

    async def bench_done(self, rate: float) -> Report: ...

    async def running(self) -> None: ...

    async def report_failure(self, reason: str, *, durable: bool = True) -> None: ...

    async def outbox_loop(self) -> None: ...


class Watchers(Protocol):
    """The monitors (:class:`~cuzk_supervisor.lifecycle.monitors.Monitors`)."""

    @property
    def last_memory(self) -> MemorySnapshot | None: ...

    def loops(self) -> Sequence[Callable[[], Coroutine[Any, Any, None]]]: ...


class Health(Protocol):
    """The run phase's health watch (:class:`.healthwatch.HealthWatch`)."""

    @property
    def verdict(self) -> asyncio.Future[str]: ...

    def watching(self) -> AbstractAsyncContextManager[None]: ...

    async def daemon_gave_up(self, reason: str) -> bool: ...


class Resources(Protocol):
    """What the plan is made from: memory (``MemorySampler``) and GPUs (a ``GpuProbe``)."""

    def sample(self) -> MemorySnapshot: ...

    async def gpus(self) -> Sequence[GpuDevice]: ...


class FetchParams(Protocol):
    """Make sure the parameters are on disk (run ``fetch_command`` unless it is empty, show
    progress, verify ``expected``); raises ``params.ParamsFailed``."""

    async def __call__(self, expected: Sequence[ExpectedFile], fetch_command: str) -> None: ...
