"""Fakes for the phase machine's collaborators, and ``Rig``: a ``Lifecycle`` built from them.

The real ``Reporter`` (with its durable ``Outbox`` and a ``StateKeeper`` over an in-memory store)
and the real ``StepDown`` are used, over a fake manager, a fake memory watch and a fake daemon:
what the phase machine decides is tested, not what the fakes pretend. Every fake operation
yields to the event loop once (``World.step``); once ``World.freeze`` was called (a kill from
the dashboard, say), every further one waits forever, so nothing runs past the kill unless the
phase machine lets it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cuzk_supervisor.adapters.machine.resources import MemorySnapshot
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import (
    InstanceGone,
    ManagerUnavailable,
    Registration,
)
from cuzk_supervisor.adapters.params import ExpectedFile, ParamsFailed
from cuzk_supervisor.adapters.proving.results import ProofResult, ProofStatus
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState, utc_now_iso
from cuzk_supervisor.adapters.state.store import StateKeeper, StateWriteError
from cuzk_supervisor.core.bench import BenchPolicy, Stretch
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, RUNNING
from cuzk_supervisor.core.risk import RiskAssessment, RiskPolicy
from cuzk_supervisor.core.units import GIB
from cuzk_supervisor.daemon.keeper import DaemonKeeper, KeeperOutcome
from cuzk_supervisor.lifecycle.machine import Lifecycle
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import MemoryTrouble, Progress, Signals
from cuzk_supervisor.lifecycle.stepdown import StepDown
from cuzk_supervisor.lifecycle.values import PhaseSettings, ReporterSettings
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy

UUID = "uuid-1"
# 256 GiB of host memory and no GPU: the default memory policy plans 6 workers, warmup 2.
HOST_BYTES = 256 * GIB


class World:
    """The clockless world the fakes live in."""

    def __init__(self) -> None:
        self.frozen = False

    def freeze(self) -> None:
        self.frozen = True

    async def step(self) -> None:
        await asyncio.sleep(0)
        if self.frozen:
            await asyncio.Event().wait()


def snapshot(host_total: int = HOST_BYTES) -> MemorySnapshot:
    return MemorySnapshot(
        timestamp=0.0, host_total=host_total, host_available=host_total, host_used=0,
        cgroup_version=None, cgroup_limit=None, cgroup_usage=None, cgroup_working_set=None,
        cgroup_inactive_file=None, cgroup_file=None, cgroup_oom=None, cgroup_oom_kill=None,
        cgroup_under_oom=None, psi_source=None, psi_some_avg10=None, psi_full_avg10=None,
        psi=None, daemon_pid=None, daemon_rss=None, daemon_processes=0,
    )  # fmt: skip


def proof(ok: bool = True, wall_s: float = 0.5, error: str = "") -> ProofResult:
    status = ProofStatus.COMPLETED if ok else ProofStatus.FAILED
    return ProofResult(job_id="job", status=status, started_at=0.0, finished_at=wall_s,
                       error=error)  # fmt: skip


def stretch(workers: int, completed: int, *, interval_s: float = 10.0) -> Stretch:
    completions = tuple(interval_s * (i + 1) for i in range(completed))
    return Stretch(workers=workers, concurrency=2, started_at=0.0, completions=completions,
                   submitted=completed)  # fmt: skip


class MemoryStore:
    """A ``StateStore`` in memory; ``fail_when(predicate)`` makes saves fail like a full disk."""

    def __init__(self, state: SupervisorState | None = None) -> None:
        self.state = state or SupervisorState()
        self.fail: Callable[[SupervisorState], bool] | None = None

    def load(self) -> SupervisorState:
        return self.state

    def save(self, state: SupervisorState) -> SupervisorState:
        if self.fail is not None and self.fail(state):
            raise StateWriteError(Path("/state/state.json"), OSError(28, "No space left"))
        self.state = state
        return state


class FakeChildTab:
    """A child's tab: its lines to the fake shipper's, under the tab it is set to."""

    def __init__(self, shipper: FakeShipper, source: str) -> None:
        self.shipper = shipper
        self.source = source

    def line(self, text: str, index: int) -> None:
        self.shipper.add_line(self.source, text)

    def note(self, text: str) -> None:
        self.shipper.add_line(self.source, text)

    def end(self) -> None:
        pass


class FakeShipper:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.uuid: str | None = None
        self._stopped = asyncio.Event()

    def add_line(self, source: str, line: str, *, milestone: bool = False, kind: str = "") -> None:
        self.lines.append((source, line))

    def listener(self, source: str) -> Callable[[str], None]:
        return lambda line: self.add_line(source, line)

    def child_tab(self, source: str, name: str, ready: object = None) -> FakeChildTab:
        return FakeChildTab(self, source)

    def set_uuid(self, uuid: str) -> None:
        self.uuid = uuid

    def enter_run_phase(self, *, after_s: float | None = None) -> None:
        self.run_phase_after_s = after_s
        self.run_phase = True

    async def run(self) -> None:
        await self._stopped.wait()

    def stop(self) -> None:
        self._stopped.set()

    def texts(self, source: str) -> list[str]:
        return [line for src, line in self.lines if src == source]


class FakeManager:
    """The manager as the reporter and the outbox see it. ``killed``: its record says killed
    and reports answer 404; ``unavailable_registers``: /register fails that many times.
    ``local``: no manager URL; /register and the reports are answered by the real client's
    local mode (``ManagerClient(None)``), as in a run without a manager."""

    def __init__(self, world: World, *, pass_rate: float = 1.0, local: bool = False) -> None:
        self.world = world
        self.pass_rate = pass_rate
        self.local = ManagerClient(None) if local else None
        self.is_local = local
        self.base_url = None if local else "http://manager.test"
        self.uuid = UUID
        self.killed: str | None = None
        self.unavailable_registers = 0
        self.register_error: Exception | None = None
        self.sent: list[Report] = []
        self.pings = 0
        self.listeners: list[Callable[[str, int, float], None]] = []
        self.clock = time.monotonic  # the outbox reads the client's clocks
        self.wall_clock = time.time

    def add_weather_listener(self, listener: Callable[[bool, str], None]) -> None:
        pass

    def add_retry_listener(self, listener: Callable[[str, int, float], None]) -> None:
        self.listeners.append(listener)

    async def register(self, label: str, min_rate: float, *, stop_s: float | None = None) -> Any:
        await self.world.step()
        if self.register_error is not None:
            raise self.register_error
        if self.unavailable_registers:
            self.unavailable_registers -= 1
            for listener in self.listeners:
                listener("register", 1, 2.0)
            raise ManagerUnavailable("register", 2, "connection refused")
        if self.local is not None:
            return await self.local.register(label, min_rate)
        return Registration(uuid=self.uuid, runner_id=7)

    async def send(self, report: Report, *, stop_s: float | None = None) -> Report:
        await self.world.step()
        if self.killed is not None:
            raise InstanceGone(report.kind, report.uuid, self.killed)
        self.sent.append(report)
        if self.local is not None:
            return await self.local.send(report)
        passed = None
        if report.kind == BENCH_DONE:
            assert report.rate is not None
            passed = report.rate >= self.pass_rate
        return dataclasses.replace(report, outcome=OUTCOME_OK, passed=passed,
                                   finished_at=utc_now_iso())  # fmt: skip

    async def bench_done(self, uuid: str, rate: float, *, stop_s: float | None = None) -> Any:
        self.sent.append(Report(kind=BENCH_DONE, uuid=uuid, rate=rate))

    async def running(self, uuid: str, *, stop_s: float | None = None) -> None:
        self.pings += 1
        if self.killed is not None:  # the real one's 404 "instance not found or already killed"
            raise InstanceGone(RUNNING, uuid, "instance not found or already killed")

    async def instance_record(self, uuid: str, *, stop_s: float | None = None) -> Any:
        await self.world.step()
        if self.killed is not None:
            return {"uuid": uuid, "state": "killed", "kill_reason": self.killed}
        return {"uuid": uuid, "state": "benchmarking"}

    def kinds(self) -> list[str]:
        return [report.kind for report in self.sent]

    def rates(self) -> list[float | None]:
        return [report.rate for report in self.sent if report.kind == BENCH_DONE]


class FakeDaemon:
    """Daemon control: records what it was told; ``fail`` maps an operation to its failure."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.keeper: DaemonKeeper | None = None
        self.source = "benchdaemon"
        self.workers: int | None = None
        self.calls: list[tuple[str, int]] = []
        self.fail: dict[str, Exception] = {}
        self.stopped = False
        self.kept = asyncio.Event()
        """Set once the run phase keeps the worker commands up."""
        self._ended: asyncio.Future[KeeperOutcome] | None = None

    @property
    def ended(self) -> asyncio.Future[KeeperOutcome]:
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        return self._ended

    def give_up(self, exit_code: int, reason: str) -> None:
        self.ended.set_result(KeeperOutcome(exit_code, reason))

    async def start(self, plan: Any, workers: int) -> None:
        await self._do("start", workers)

    async def replace(self, plan: Any, workers: int) -> None:
        await self._do("replace", workers)

    async def _do(self, what: str, workers: int) -> None:
        await self.world.step()
        self.calls.append((what, workers))
        if what in self.fail:
            raise self.fail.pop(what)
        self.workers = workers

    def forget_failures(self) -> None:
        self.calls.append(("forget_failures", self.workers or 0))

    async def stop(self) -> None:
        """As the real one: the keeper's run ends with "stopped" (what ``ended`` resolves to)."""
        self.stopped = True
        if not self.ended.done():
            self.ended.set_result(KeeperOutcome(0, "stopped"))

    @asynccontextmanager
    async def workers_kept(self) -> AsyncIterator[None]:
        self.calls.append(("workers_kept", 0))
        self.kept.set()
        yield


Outcome = ProofResult | Stretch | BaseException | Callable[[Progress], Any]


class FakeProofs:
    """Proofs by script: ``script[phase]`` lists what each call in that phase does (a result to
    return, an exception to raise, or a function of the progress); past the list, a proof
    succeeds and a stretch completes ``completed`` proofs."""

    def __init__(self, world: World, progress: Progress, *, completed: int = 6) -> None:
        self.world = world
        self.progress = progress
        self.completed = completed
        self.script: dict[str, list[Outcome]] = {}
        self.calls: list[tuple[str, int]] = []
        self.released: list[str] = []  # the phase of each release_input

    async def prove(self, budget_s: float) -> ProofResult:
        outcome = await self._next(0)
        result = outcome if isinstance(outcome, ProofResult) else proof()
        self.progress.proofs_done += 1
        return result

    async def stretch(
        self, policy: BenchPolicy, workers: int, deadline: Callable[[], float]
    ) -> Stretch:
        outcome = await self._next(workers)
        if isinstance(outcome, Stretch):
            return outcome
        return stretch(workers, min(self.completed, policy.max_proofs))

    def release_input(self) -> None:
        self.released.append(self.progress.phase)

    async def _next(self, workers: int) -> Any:
        await self.world.step()
        phase = self.progress.phase
        self.calls.append((phase, workers))
        queue = self.script.get(phase, [])
        outcome = queue.pop(0) if queue else None
        if callable(outcome) and not isinstance(outcome, BaseException):
            outcome = outcome(self.progress)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def trouble_in_bench(partial: Stretch, cause: str = "memory critical") -> Callable[[Progress], Any]:
    """A stretch cut by memory trouble, its completions so far left where the runner leaves
    them."""

    def act(progress: Progress) -> Any:
        progress.stretch = partial
        raise MemoryTrouble(cause)

    return act


class FakeWatch:
    """The memory watch as a step-down sees it: nothing measured (one step down)."""

    def __init__(self) -> None:
        self.policy = RiskPolicy()
        self.assessment: RiskAssessment | None = None
        self.base_bytes: int | None = None
        self.plateau_bytes: int | None = None
        self.acknowledged = 0

    def acknowledge(self) -> None:
        self.acknowledged += 1


class FakeResources:
    def __init__(self, host_total: int = HOST_BYTES) -> None:
        self.host_total = host_total

    def sample(self) -> MemorySnapshot:
        return snapshot(self.host_total)

    async def gpus(self) -> Sequence[Any]:
        return []


class FakeMonitors:
    def __init__(self) -> None:
        self.last_memory: MemorySnapshot | None = snapshot()

    def loops(self) -> list[Callable[[], Any]]:
        return []


class FakeFetch:
    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[tuple[tuple[str, ...], str]] = []
        self.error: ParamsFailed | None = None

    async def __call__(self, expected: Sequence[ExpectedFile], fetch_command: str) -> None:
        await self.world.step()
        self.calls.append((tuple(e.name for e in expected), fetch_command))
        if self.error is not None:
            raise self.error


DEFAULTS: dict[str, Any] = {
    "label": "C.test",
    "params_fetch_command": "fetch-params",
    "params_expected": ("p.params:3000",),
    "exit_after_run": True,
    "bench_count": 6,
    "status_interval_s": 1,
}


@dataclasses.dataclass
class Rig:
    machine: Lifecycle
    world: World
    store: MemoryStore
    manager: FakeManager
    daemon: FakeDaemon
    proofs: FakeProofs
    fetch: FakeFetch
    shipper: FakeShipper
    watch: FakeWatch
    reporter: Reporter
    phases: list[str]

    async def run(self) -> int:
        return await self.machine.run()

    def on_entering(self, phase: str, action: Callable[[], None]) -> None:
        self.machine.phase_listeners.append(lambda entered: action() if entered == phase else None)

    def kill_in(self, phase: str, reason: str = "killed by the manager: test") -> None:
        """The dashboard's kill, seen by the status task while the machine is in ``phase``."""

        def kill() -> None:
            self.manager.killed = reason
            self.machine.signals.mark_gone(reason)
            self.world.freeze()

        self.on_entering(phase, kill)


def build(
    *,
    store: MemoryStore | None = None,
    host_total: int = HOST_BYTES,
    pass_rate: float = 1.0,
    completed: int = 6,
    local: bool = False,
    **settings: Any,
) -> Rig:
    s = Settings(**{**DEFAULTS, **settings})
    world = World()
    store = store or MemoryStore()
    state = StateKeeper(store)  # type: ignore[arg-type]
    manager = FakeManager(world, pass_rate=pass_rate, local=local)
    progress, signals = Progress(), Signals()
    shipper = FakeShipper()
    daemon = FakeDaemon(world)
    watch = FakeWatch()
    memory_policy = policy(MemoryPolicy, s)
    reporter = Reporter(
        policy(ReporterSettings, s), label=s.label, min_rate=pass_rate, manager=manager,  # type: ignore[arg-type]
        state=state, outbox=Outbox.for_keeper(manager, state),
        shipper=shipper, signals=signals, progress=progress,  # type: ignore[arg-type]
        retries=LifecycleRetries(),
    )  # fmt: skip
    manager.add_retry_listener(reporter.on_manager_retry)
    stepdown = StepDown(daemon=daemon, watch=watch, signals=signals, progress=progress,
                        memory_policy=memory_policy, active_partitions=lambda: None)  # fmt: skip
    proofs = FakeProofs(world, progress, completed=completed)
    fetch = FakeFetch(world)
    machine = Lifecycle(
        config=policy(PhaseSettings, s), state=state, shipper=shipper, metrics=SupervisorMetrics(),  # type: ignore[arg-type]
        memory_policy=memory_policy, bench_policy=policy(BenchPolicy, s), progress=progress,
        signals=signals,
        resources=FakeResources(host_total), fetch_params=fetch, daemon=daemon, proofs=proofs,
        stepdown=stepdown, reporter=reporter, monitors=FakeMonitors(),
    )  # fmt: skip
    phases: list[str] = []
    machine.phase_listeners.append(phases.append)
    return Rig(machine, world, store, manager, daemon, proofs, fetch, shipper, watch, reporter,
               phases)  # fmt: skip
