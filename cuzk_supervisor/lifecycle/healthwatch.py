"""The run phase's health watch (issue 34): every ``health_interval_s``, what the supervisor can
see of the machine, judged by the pure policy (:mod:`cuzk_supervisor.core.health`), and the
ladder's actions (:mod:`cuzk_supervisor.core.healthladder`) carried out.

It reads the daemon's HTTP status (partitions with their live times, GPU workers, counters), its
totals (``GetMetrics``: every failed proof counted), NVML (XID events, ECC, retired pages, clocks,
a device that stops answering) and the keeper's starts, exits and crash loop; none of it goes to
the manager. It says each change of the findings once (``health.changed`` and a line in the
``setup`` tab, the terminal, ``/metrics``, ``/readyz``); restarts the daemon where that can help;
and, to tell the manager, pushes the reason first (flushed), then sends ``/bench-done`` with the
rate the machine now delivers. A manager that answers ``passed: false`` has killed the instance:
:attr:`verdict` is done with the reason and the phase machine ends the run (exit 10). A report
the manager did not answer stays in the outbox (and the ``/running`` ping then finds the kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog

from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.manager.values import InstanceGone, ManagerError
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.adapters.state.store import StateWriteError
from cuzk_supervisor.core.boundsample import StatusSample
from cuzk_supervisor.core.health import Assessment, HealthState, Level, assess
from cuzk_supervisor.core.healthevidence import GpuView, Observation, daemon_view, proof_totals
from cuzk_supervisor.core.healthladder import (
    Action,
    LadderPolicy,
    LadderState,
    Restart,
    Say,
    Tell,
    climb,
)
from cuzk_supervisor.core.healthpolicy import HealthPolicy
from cuzk_supervisor.daemon.keeper import DaemonKeeper
from cuzk_supervisor.deadline import within
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, Progress, Signals
from cuzk_supervisor.serve.metricsink import MetricsSink

if TYPE_CHECKING:  # built in the composition root only where NVML is the GPU probe
    from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth

log = structlog.get_logger()

REASON_PUSH_S = 30.0
"""How long the reason's push may hold the report (then /bench-done goes anyway)."""
CALL_S = 5.0
"""One status read or GetMetrics call at most."""


class Daemon(Protocol):
    keeper: DaemonKeeper | None

    async def ready(self) -> None: ...


class Manager(Protocol):
    @property
    def judged(self) -> bool: ...

    @property
    def min_rate(self) -> float: ...

    async def bench_done(self, rate: float) -> Report: ...


class MetricsClient(Protocol):
    async def metrics(self, budget_s: float | None = None) -> str: ...


def metrics_reader(
    client_factory: Callable[[], AbstractAsyncContextManager[MetricsClient]],
    on_answer: Callable[[], None] = lambda: None,
) -> Callable[[], Awaitable[str | None]]:
    """The daemon's GetMetrics text, or None (no answer within ``CALL_S``); ``on_answer`` is
    told of each answer (``DaemonControl.note_answer``: the liveness probe is spared)."""

    async def read() -> str | None:
        try:
            async with client_factory() as client:
                text = await within(client.metrics(budget_s=CALL_S), CALL_S + 1)
        except Exception:  # any failure to answer is no figure this time
            return None
        on_answer()
        return text

    return read


def bench_gpu_stage_s(samples: Iterable[StatusSample], time_scale: float) -> tuple[float, ...]:
    """The GPU stage's time of each partition the bench's status samples saw done (seconds)."""
    seen: dict[tuple[str, int], float] = {}
    for sample in samples:
        for pipeline in sample.pipelines:
            for part in pipeline.partitions:
                if part.state == "done" and part.gpu_ms is not None:
                    seen[(pipeline.job_id, part.index)] = part.gpu_ms / 1000 / time_scale
    return tuple(seen.values())


class Unwatched:
    """No health watch: the phase machine's tests, and where none is built."""

    def __init__(self) -> None:
        self._verdict: asyncio.Future[str] | None = None

    @property
    def verdict(self) -> asyncio.Future[str]:
        if self._verdict is None:
            self._verdict = asyncio.get_running_loop().create_future()
        return self._verdict

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        yield

    async def daemon_gave_up(self, reason: str) -> bool:
        return False


@dataclass(eq=False, kw_only=True)
class HealthWatch:
    interval_s: float
    policy: HealthPolicy
    ladder: LadderPolicy
    daemon: Daemon
    manager: Manager
    shipper: LogShipper
    metrics: MetricsSink
    progress: Progress
    signals: Signals
    read_status: Callable[[], Awaitable[object | None]]
    read_totals: Callable[[], Awaitable[str | None]]
    gpus: NvmlHealth | None = None
    """None as well where its NVML is not available."""
    time_scale: float = 1.0
    manager_min_rate: float = 50.0
    clock: Callable[[], float] = time.monotonic
    call_s: float = CALL_S
    state: HealthState = field(default_factory=HealthState, init=False)
    ladder_state: LadderState = field(default_factory=LadderState, init=False)
    assessment: Assessment | None = field(default=None, init=False)
    _verdict: asyncio.Future[str] | None = field(default=None, init=False)
    _crash_loop: str = field(default="", init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _nvml_read: asyncio.Future[tuple[GpuView, ...]] | None = field(default=None, init=False)
    _nvml_since: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.gpus is not None and not self.gpus.available:
            self.gpus = None

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    @property
    def verdict(self) -> asyncio.Future[str]:
        """Done with the reason once the manager was told and answered ``passed: false`` (it
        ends this instance); with the error when the report could not be written."""
        if self._verdict is None:
            self._verdict = asyncio.get_running_loop().create_future()
        return self._verdict

    @property
    def told(self) -> bool:
        return self._verdict is not None and self._verdict.done()

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Watch while the block runs (nothing when ``health_interval_s`` is 0). A stuck
        partition is held to the GPU stage's times the bench sampled, when it did."""
        if not self.enabled:
            yield
            return
        measured = bench_gpu_stage_s(self.progress.bench_samples, self.time_scale)
        self.state = HealthState.seeded(measured)
        log.info("health.watching", interval_s=self.interval_s, ladder=self.ladder.top,
                 gpu_stage_samples=len(measured))  # fmt: skip
        task = asyncio.create_task(self._loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(self) -> None:
        while not self.told:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except StateWriteError as exc:  # the report could not be made durable: exit 9
                if not self.verdict.done():
                    self.verdict.set_exception(exc)
            except Exception as exc:  # a bug in one tick must not end the watch
                log.error("health.tick_failed", reason=f"{type(exc).__name__}: {exc}")

    async def daemon_gave_up(self, reason: str) -> bool:
        """The keeper gave up on the daemon (a crash loop): judged now; True once told."""
        if not self.enabled:
            return False
        self._crash_loop = reason
        await self.tick()
        return self.told

    async def tick(self) -> None:
        async with self._lock:
            observation = await self.observe()
            self.state, assessment = assess(self.policy, self.state, observation)
            self.assessment = assessment
            self.metrics.health(int(assessment.level), [f.kind for f in assessment.findings])
            self.ladder_state, actions = climb(
                self.ladder, self.ladder_state, assessment, min_rate=self.manager_min_rate,
                rate_time_scale=self.time_scale, judged=self.manager.judged,
            )  # fmt: skip
            for action in actions:
                await self._carry_out(action)

    # --- what it sees ---------------------------------------------------------------------

    async def observe(self) -> Observation:
        document, text, gpus = await asyncio.gather(
            self._status(), self.read_totals(), self._nvml()
        )
        keeper = self.daemon.keeper
        return Observation(
            at=self.clock(),
            daemon=daemon_view(document, self.time_scale),
            totals=proof_totals(text) if text else None,
            gpus=gpus,
            daemon_starts=keeper.starts if keeper is not None else 0,
            daemon_exits=sum(keeper.exits_by_kind.values()) if keeper is not None else 0,
            crash_loop=self._crash_loop,
        )

    async def _status(self) -> object | None:
        try:
            return await within(self.read_status(), self.call_s)
        except (TimeoutError, OSError):
            return None

    async def _nvml(self) -> tuple[GpuView, ...] | None:
        """NVML's views; a read that stalls (a GPU in a bad state can hold NVML) is waited for
        across ticks, never twice at once; stalled past ``gpu_lost_s``, no GPU answers."""
        if self.gpus is None:
            return None
        now = self.clock()
        if self._nvml_read is None:
            self._nvml_read = asyncio.ensure_future(asyncio.to_thread(self.gpus.read))
            self._nvml_since = now
        with contextlib.suppress(TimeoutError):
            await within(asyncio.shield(self._nvml_read), self.call_s)
        if not self._nvml_read.done():
            stalled = now - (self._nvml_since or now)
            if stalled < self.policy.gpu_lost_s:
                return None
            error = f"NVML has not answered for {stalled:.0f} s"
            count = self.gpus.device_count
            return tuple(GpuView(i, answering=False, error=error) for i in range(count))
        read, self._nvml_read = self._nvml_read, None
        try:
            return read.result()
        except Exception as exc:  # a broken binding: no evidence, said once at debug level
            log.debug("health.nvml_read_failed", reason=str(exc))
            return None

    # --- what it does ---------------------------------------------------------------------

    async def _carry_out(self, action: Action) -> None:
        if isinstance(action, Say):
            self._say(action)
        elif isinstance(action, Restart):
            await self._restart(action)
        elif isinstance(action, Tell):
            await self._tell(action)

    def _say(self, action: Say) -> None:
        level = {Level.HEALTHY: "info", Level.DEGRADED: "warning"}.get(action.level, "error")
        getattr(log, level)("health.changed", health=action.level.word, reason=action.text)
        self._ship(f"health: {action.text}")
        if action.level is not Level.HEALTHY:
            self.progress.last_failure = f"health: {action.text}"

    def _ship(self, line: str) -> int | None:
        """A health finding: a milestone in the supervisor's tab and in the run phase's daemon
        tab (where it explains what the daemon's lines show); its number in the former."""
        seq = self.shipper.add_line("setup", line, milestone=True, kind="health")
        self.shipper.add_line("cuzk", line, milestone=True, kind="health")
        return seq

    async def _restart(self, action: Restart) -> None:
        keeper = self.daemon.keeper
        self.metrics.health_action("restart")
        log.warning("health.restart", reason=action.reason, kind=action.finding.kind)
        self._ship(f"health: {action.reason}")
        if keeper is None:
            return
        keeper.restart_with(keeper.values)
        with contextlib.suppress(LifecycleFailure):  # a keeper that gives up ends the run itself
            await self.daemon.ready()

    async def _tell(self, action: Tell) -> None:
        self.metrics.health_action("tell")
        log.error("health.telling_manager", reason=action.reason, rate=round(action.rate, 3),
                  kind=action.finding.kind)  # fmt: skip
        seq = self._ship(f"health: {action.reason}")
        # The reason first, and every line of the tab before it: once /bench-done is answered,
        # the instance is destroyed.
        if not await self.shipper.flush(REASON_PUSH_S, through=seq):
            log.warning("health.reason_not_pushed", detail="sending /bench-done anyway")
        try:
            done = await self.manager.bench_done(action.rate)
        except InstanceGone as exc:
            self.signals.mark_gone(exc.message)
            return
        except ManagerError as exc:
            log.warning("health.report_queued", reason=str(exc),
                        detail="the outbox sends /bench-done when the manager answers")  # fmt: skip
            self.signals.outbox_kick.set()
            return
        if done.passed is False:
            if not self.verdict.done():
                self.verdict.set_result(action.reason)
        else:
            log.warning("health.report_unanswered", passed=done.passed,
                        detail="no kill: the run phase goes on")  # fmt: skip
