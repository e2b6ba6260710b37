"""The run phase's health watch (lifecycle/healthwatch) with fakes around it: what it reads,
and each step of the ladder carried out (said, restarted, told with the reason pushed first),
the manager's answers, an NVML read that stalls; and what /metrics and /readyz show of it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from healthdocs import document, proving, worker
from prometheus_client.parser import text_string_to_metric_families

from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth
from cuzk_supervisor.adapters.manager.values import InstanceGone, ManagerUnavailable
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.core.bound import PartitionSample, PipelineSample, StatusSample
from cuzk_supervisor.core.healthladder import LadderPolicy
from cuzk_supervisor.core.healthpolicy import HealthPolicy
from cuzk_supervisor.core.reports import BENCH_DONE
from cuzk_supervisor.lifecycle.healthwatch import HealthWatch, Unwatched, bench_gpu_stage_s
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.serve.health import HealthServer
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.sim.machine.fakenvml import FakeNvml
from cuzk_supervisor.sim.machine.gpustate import GpuState

TOTALS = "cuzk_proofs_completed_total {c}\ncuzk_proofs_failed_total {f}\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Keeper:
    starts: int = 1
    exits_by_kind: dict[str, int] = field(default_factory=dict)
    values: object = "the plan's values"
    restarted_with: list[object] = field(default_factory=list)

    def restart_with(self, values: object) -> None:
        self.restarted_with.append(values)
        self.starts += 1


@dataclass
class Daemon:
    keeper: Keeper = field(default_factory=Keeper)
    readies: int = 0

    async def ready(self) -> None:
        self.readies += 1


@dataclass
class Manager:
    order: list[str]
    judged: bool = True
    min_rate: float = 30.0
    answer: object = False  # passed, or an exception to raise
    rates: list[float] = field(default_factory=list)

    async def bench_done(self, rate: float) -> Report:
        self.order.append(f"bench_done {rate:g}")
        self.rates.append(rate)
        if isinstance(self.answer, BaseException):
            raise self.answer
        passed = self.answer if isinstance(self.answer, bool) else None
        return Report(kind=BENCH_DONE, uuid="u", rate=rate, passed=passed)


@dataclass
class Shipper:
    order: list[str]
    lines: list[tuple[str, str]] = field(default_factory=list)

    def add_line(self, source: str, line: str, *, milestone: bool = False, kind: str = "") -> int:
        assert milestone  # a health finding is a milestone, in the setup and cuzk tabs
        self.lines.append((source, line))
        if source == "setup":
            self.order.append(f"line {line}")
        return len(self.lines)

    async def flush(self, deadline_s: float | None = None, *, through: int | None = None) -> bool:
        # Through the reason's own line: the report waits for it, not only for a turn.
        assert through is not None
        assert self.lines[through - 1][0] == "setup"
        self.order.append(f"flush through {self.lines[through - 1][1]}")
        return True


@dataclass
class World:
    """What the watch reads, set by each test; and what it did, read back."""

    documents: list[Any] = field(default_factory=lambda: [document()])
    totals: tuple[int, int] | None = (10, 0)
    order: list[str] = field(default_factory=list)
    gpus: GpuState = field(default_factory=lambda: GpuState(gpus=1))

    async def status(self) -> object | None:
        return self.documents[0] if len(self.documents) == 1 else self.documents.pop(0)

    async def metrics_text(self) -> str | None:
        return TOTALS.format(c=self.totals[0], f=self.totals[1]) if self.totals else None


def watch(world: World, *, nvml: bool = True, **kwargs: Any) -> tuple[HealthWatch, dict[str, Any]]:
    parts: dict[str, Any] = {
        "daemon": Daemon(), "manager": Manager(world.order), "shipper": Shipper(world.order),
        "metrics": SupervisorMetrics(), "progress": Progress(), "signals": Signals(),
        "clock": Clock(),
    }  # fmt: skip
    parts.update(kwargs)
    gpus = NvmlHealth(FakeNvml(1, lambda: world.gpus)) if nvml else None
    health = HealthWatch(
        interval_s=1.0, policy=HealthPolicy(gpu_lost_s=60, stuck_min_s=120),
        ladder=parts.pop("ladder", LadderPolicy()), read_status=world.status,
        read_totals=world.metrics_text, gpus=gpus, manager_min_rate=30.0, **parts,
    )  # fmt: skip
    return health, parts


def sample(metrics: SupervisorMetrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(name)


async def test_a_healthy_machine_is_watched_in_silence() -> None:
    world = World()
    health, parts = watch(world)
    for _ in range(3):
        await health.tick()
        parts["clock"].now += 30
    assert world.order == []
    assert health.assessment is not None
    assert not health.assessment.findings
    assert sample(parts["metrics"], "cuzk_supervisor_health_level") == 0


async def test_a_lost_gpu_is_said_then_told_the_reason_pushed_first() -> None:
    world = World()
    health, parts = watch(world)
    await health.tick()
    world.gpus.lose(0)
    await health.tick()
    assert world.order[0].startswith("line health: broken: GPU 0 fell off the bus")
    assert world.order[1].startswith("line health: broken: GPU 0 fell off the bus")
    # The flush goes through the told reason's line (the second), then the report.
    told = world.order[1].removeprefix("line ")
    assert world.order[2:] == [f"flush through {told}", "bench_done 0"]
    said = [line for source, line in parts["shipper"].lines if source == "setup"]
    assert [line for source, line in parts["shipper"].lines if source == "cuzk"] == said
    assert health.verdict.done()
    assert "XID 79" in health.verdict.result()
    assert parts["progress"].last_failure.startswith("health: broken")
    metrics = parts["metrics"]
    assert sample(metrics, "cuzk_supervisor_health_level") == 2
    assert sample(metrics, "cuzk_supervisor_health_finding", kind="gpu-lost") == 1
    assert sample(metrics, "cuzk_supervisor_health_actions_total", action="tell") == 1


async def test_a_stuck_partition_restarts_the_daemon_with_its_values() -> None:
    stuck = document(pipelines=[proving("j", gpu_ms=500_000)],
                     workers=[worker(0, 0, "j", 4, 500.0)])  # fmt: skip
    world = World(documents=[stuck])
    health, parts = watch(world)
    await health.tick()
    daemon = parts["daemon"]
    assert daemon.keeper.restarted_with == ["the plan's values"]
    assert daemon.readies == 1
    assert any("restarting the daemon: partition 4 of job j" in line for _, line in
               parts["shipper"].lines)  # fmt: skip
    assert not health.verdict.done()


@pytest.mark.parametrize(
    ("answer", "gone", "kicked", "told"),
    [
        (InstanceGone("bench-done", "u", "instance not found"), True, False, False),
        (ManagerUnavailable("bench-done", 3, "refused"), False, True, False),
        (True, False, False, False),
        (False, False, False, True),
    ],
    ids=["already-killed", "manager-away", "passed", "killed"],
)
async def test_the_managers_answer_to_the_tell(answer, gone, kicked, told) -> None:
    world = World()
    signals = Signals()
    health, _ = watch(world, manager=Manager(world.order, answer=answer), signals=signals)
    world.gpus.lose(0)
    await health.tick()
    assert signals.gone.is_set() is gone
    assert signals.outbox_kick.is_set() is kicked
    assert health.told is told
    await health.tick()
    assert world.order.count("bench_done 0") == 1  # told once, whatever the answer


async def test_a_crash_loop_is_told_at_once() -> None:
    world = World(documents=[None], totals=None)
    health, parts = watch(world, nvml=False)
    assert await health.daemon_gave_up("crash loop: 3 failures within 60 s") is True
    assert parts["manager"].rates == [0.0]
    assert "the daemon crash-loops" in health.verdict.result()


async def test_a_ladder_capped_at_restart_never_tells() -> None:
    world = World()
    health, _ = watch(world, ladder=LadderPolicy(top="restart"))
    world.gpus.lose(0)
    await health.tick()
    assert not any(entry.startswith("bench_done") for entry in world.order)
    assert "not told (the ladder stops before telling the manager)" in world.order[-1]


async def test_an_nvml_read_that_stalls_is_a_lost_gpu_once_it_stalls_past_the_grace() -> None:
    world = World()
    release = threading.Event()
    reads = NvmlHealth(FakeNvml(1, lambda: world.gpus))
    stalling = {"on": False}
    real_read = reads.read

    def read() -> Any:
        if stalling["on"]:
            release.wait(60)
        return real_read()

    reads.read = read  # type: ignore[method-assign]
    health, parts = watch(world, nvml=False, call_s=30)  # the first read: plenty of time
    health.gpus = reads  # the NVML the watch reads
    await health.tick()
    assert health._nvml_read is None  # done
    health.call_s = 0.2  # how long a tick waits for a read that hangs
    stalling["on"] = True
    try:
        await health.tick()  # the read hangs: no NVML evidence this time
        assert health.assessment is not None
        assert not health.assessment.findings
        parts["clock"].now += 61
        await health.tick()  # still the same read, past the grace
        assert health.assessment is not None
        (lost,) = health.assessment.findings
        assert (lost.kind, lost.gpu) == ("gpu-lost", 0)
        assert "NVML has not answered for 61 s" in lost.reason
    finally:
        release.set()


def test_the_gpu_stage_the_bench_sampled_is_each_done_partition_once() -> None:
    def at(t: float, gpu_ms: float | None, state: str = "done") -> StatusSample:
        parts = (PartitionSample(0, state, 30_000, gpu_ms), PartitionSample(1, "gpu", 1, 5))
        return StatusSample(at=t, synth_max=10, synth_active=0,
                            pipelines=(PipelineSample("j", parts, 10),))  # fmt: skip

    samples = [at(0, None, "gpu"), at(1, 3_000), at(2, 3_000)]
    assert bench_gpu_stage_s(samples, time_scale=100) == (0.03,)


async def test_a_watch_off_or_absent_watches_nothing() -> None:
    health, _ = watch(World())
    health.interval_s = 0
    async with health.watching():
        assert not health.enabled
    assert await health.daemon_gave_up("x") is False
    unwatched = Unwatched()
    async with unwatched.watching():
        assert not unwatched.verdict.done()


# --- /readyz -----------------------------------------------------------------------------------


@dataclass
class Source:
    phase: str = "run"
    daemon_ready: bool = True
    last_failure: str = ""
    health: dict[str, str] | None = None


@pytest.fixture
async def readyz() -> AsyncIterator[tuple[Source, httpx.AsyncClient]]:
    source = Source()
    async with (
        HealthServer("127.0.0.1:0", source, SupervisorMetrics()) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        yield source, http


async def test_readyz_says_what_the_watch_found_and_broken_is_not_ready(readyz) -> None:
    source, http = readyz
    source.health = {"level": "healthy", "reason": ""}
    response = await http.get("/readyz")
    assert (response.status_code, response.json()) == (200, {"phase": "run", "daemon_ready": True})
    source.health = {"level": "degraded", "reason": "degraded: GPU 0 held at 45%"}
    response = await http.get("/readyz")
    assert response.status_code == 200
    assert response.json()["health"] == source.health
    source.health = {"level": "broken", "reason": "broken: GPU 0 fell off the bus"}
    response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["health"] == source.health


async def test_the_watch_runs_its_ticks_while_watching() -> None:
    world = World()
    health, _ = watch(world)
    health.interval_s = 0.01
    async with health.watching():
        for _ in range(500):
            if health.assessment is not None:
                break
            await asyncio.sleep(0.01)
    assert health.assessment is not None


# --- the terminal view -------------------------------------------------------------------------


def test_the_terminal_shows_each_health_change_the_restart_and_the_tell() -> None:
    from cuzk_supervisor.cli.view import Line, ViewModel

    model = ViewModel()
    events = [
        {"event": "health.changed", "level": "warning", "health": "degraded",
         "reason": "degraded: partition 3 stuck"},
        {"event": "health.restart", "level": "warning", "reason": "restarting the daemon: x"},
        {"event": "health.changed", "level": "info", "health": "healthy",
         "reason": "healthy again: nothing found"},
        {"event": "health.telling_manager", "level": "error", "reason": "broken: GPU 0 lost"},
    ]  # fmt: skip
    shown = [(a.kind, a.text) for e in events for a in model.feed(e) if isinstance(a, Line)]
    assert shown == [
        ("warning", "health: degraded: partition 3 stuck"),
        ("warning", "health: restarting the daemon: x"),
        ("note", "health: healthy again: nothing found"),
        ("error", "telling the manager: broken: GPU 0 lost"),
    ]
