"""The reporter's and the status loop's fleet manners (issue 22): the kill look-up phase by phase,
jittered timers with an injected random source, and a record missing from a listing never read
as a kill."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from types import SimpleNamespace
from typing import Any

import pytest
from phasefakes import UUID, FakeManager, FakeShipper, MemoryStore, World

from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import InstanceGone, ManagerUnavailable
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.core.reconcile import manager_time
from cuzk_supervisor.core.reports import OUTCOME_OK, PARAM_DONE
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.lifecycle.killlookup import LOOKUP_PHASES
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.lifecycle.monitors import Monitors
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.values import MonitorSettings, ReporterSettings
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Draws:
    """A random source that draws from a list, then 0.5."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0) if self.values else 0.5


def reporter(rng: Any, **settings: Any) -> tuple[Reporter, SimpleNamespace]:
    world, signals, progress = World(), Signals(), Progress()
    manager = FakeManager(world)
    keeper = StateKeeper(MemoryStore(SupervisorState(uuid=UUID)))  # type: ignore[arg-type]
    clock = Clock()
    s = Settings(label="C.test", **settings)
    rep = Reporter(
        policy(ReporterSettings, s), label="C.test", min_rate=1.0, manager=manager, state=keeper,  # type: ignore[arg-type]
        outbox=Outbox.for_keeper(manager, keeper), shipper=FakeShipper(),  # type: ignore[arg-type]
        signals=signals, progress=progress, retries=LifecycleRetries(), clock=clock, rng=rng,
    )  # fmt: skip
    rep.uuid = UUID
    return rep, SimpleNamespace(manager=manager, signals=signals, progress=progress, clock=clock)


def test_no_periodic_read_of_the_whole_table_by_default():
    rep, rig = reporter(random.Random(1))
    for phase in (*LOOKUP_PHASES, "run", "report"):
        for _ in range(5):
            rig.clock.now += 10_000
            assert not rep.lookup_due(phase)


def test_a_periodic_look_up_when_asked_is_jittered_and_never_in_the_run_phase():
    rep, rig = reporter(Draws(0.25, 0.0, 1.0), manager_status_lookup_s=600.0, manager_jitter=0.2)
    assert not rep.lookup_due("warmup")  # the first one at 0.25 of the interval: +150 s
    rig.clock.now += 149
    assert not rep.lookup_due("warmup")
    rig.clock.now += 1
    assert rep.lookup_due("warmup")
    rig.clock.now += 480 - 1  # the next one 600 * 0.8 later
    assert not rep.lookup_due("bench")
    rig.clock.now += 1
    assert rep.lookup_due("bench")
    rig.clock.now += 10_000
    assert not rep.lookup_due("run")  # the /running ping is the run phase's look-up
    assert not rep.lookup_due("register")


async def test_the_first_ping_falls_anywhere_in_its_interval_then_each_is_varied():
    rep, rig = reporter(Draws(0.1, 1.0), running_ping_interval_s=300.0, manager_jitter=0.2)
    assert not rep.ping_due()
    await rep.running()
    rig.clock.now += 29
    assert not rep.ping_due()
    rig.clock.now += 1  # 0.1 of 300 s
    assert rep.ping_due()
    assert await rep.ping(stop_s=1.0)
    rig.clock.now += 359  # the next one 300 * 1.2 later
    assert not rep.ping_due()
    rig.clock.now += 1
    assert rep.ping_due()


async def test_a_fleet_reaching_the_run_phase_together_pings_spread_over_the_interval():
    rng = random.Random(5)
    firsts = []
    for _ in range(200):
        rep, rig = reporter(rng, running_ping_interval_s=300.0)
        await rep.running()
        start = rig.clock.now
        while not rep.ping_due():
            rig.clock.now += 1
        firsts.append(rig.clock.now - start)
    assert min(firsts) < 30
    assert max(firsts) > 270
    assert max(sum(1 for f in firsts if s <= f < s + 30) for s in range(0, 300, 30)) < 3 * 20


async def test_a_record_missing_from_the_listing_is_not_a_kill():
    rep, rig = reporter(random.Random(1))

    async def unlisted(uuid: str, *, stop_s: float | None = None) -> Any:
        return None  # the listing did not hold us: a proxy, a cache, an empty database

    rig.manager.instance_record = unlisted
    assert await rep.look_up_kill(stop_s=1.0) is None
    await rep._check_alive()  # before /bench-done: goes on
    assert not rig.signals.gone.is_set()


async def test_the_status_loop_first_ticks_at_a_random_point_and_looks_up_only_when_due():
    rep, rig = reporter(random.Random(3), status_interval_s=0.05, manager_jitter=0.2)
    lookups = 0

    async def look_up_kill(*, stop_s: float) -> str | None:
        nonlocal lookups
        lookups += 1
        return None

    rep.look_up_kill = look_up_kill  # type: ignore[method-assign]
    watch = MemoryWatch(SimpleNamespace(), RiskPolicy(), lambda: None)  # type: ignore[arg-type]
    monitor_settings = policy(MonitorSettings, Settings(status_interval_s=0.05, manager_jitter=0.2))
    monitors = Monitors(monitor_settings, progress=rig.progress, signals=rig.signals, watch=watch,
                        gpu=None, metrics=SupervisorMetrics(),  # type: ignore[arg-type]
                        daemon=SimpleNamespace(restarts=0), manager=rep,
                        rng=random.Random(3))  # fmt: skip
    rig.progress.phase = "warmup"
    task = asyncio.create_task(monitors.status_loop())
    await asyncio.sleep(0.4)
    task.cancel()
    assert lookups == 0  # manager_status_lookup_s is 0: no read of the whole table


async def test_the_run_phase_switches_the_log_budget():
    rep, _ = reporter(random.Random(1), log_push_interval_s=90.0)
    await rep.running()
    # The run phase's budget, after one more turn at the earlier one (its default).
    assert rep.shipper.run_phase  # type: ignore[attr-defined]
    assert rep.shipper.run_phase_after_s is None  # type: ignore[attr-defined]


def param_done_acked(created_at: str) -> Report:
    queued = Report(kind=PARAM_DONE, uuid=UUID, created_at=created_at)
    return dataclasses.replace(queued, outcome=OUTCOME_OK)


async def test_a_prompt_param_done_ack_starts_the_bench_clock_without_reading_the_table():
    """A fleet reaching params together would read the whole table N times at once: acknowledged
    within one request's time, the queued time starts the clock (early by at most that)."""
    rep, rig = reporter(random.Random(1))
    reads = 0

    async def record(uuid: str, *, stop_s: float | None = None) -> Any:
        nonlocal reads
        reads += 1
        return {"uuid": uuid, "state": "params_done", "param_done_at": "2026-01-01 00:00:01"}

    rig.manager.instance_record = record
    epoch = manager_time("2026-01-01T00:00:00Z")
    assert epoch is not None
    rep.wall_clock = lambda: epoch + 2.0  # acknowledged 2 s after it was queued
    await rep._after_drain((param_done_acked("2026-01-01T00:00:00.000Z"),))
    assert reads == 0
    assert rep.state.state.bench_clock_start == epoch


async def test_a_slow_param_done_ack_reads_the_manager_stamp():
    """Acknowledged long after it was queued (retried: an earlier try may have been applied),
    the manager's own param_done_at is read."""
    rep, rig = reporter(random.Random(1))
    reads = 0

    async def record(uuid: str, *, stop_s: float | None = None) -> Any:
        nonlocal reads
        reads += 1
        return {"uuid": uuid, "state": "params_done", "param_done_at": "2026-01-01 00:00:30"}

    rig.manager.instance_record = record
    epoch = manager_time("2026-01-01T00:00:00Z")
    assert epoch is not None
    rep.wall_clock = lambda: epoch + 300.0
    await rep._after_drain((param_done_acked("2026-01-01T00:00:00.000Z"),))
    assert reads == 1
    assert rep.state.state.bench_clock_start == epoch + 30.0


async def test_before_bench_done_one_running_asks_whether_the_record_was_killed():
    """Issue 43: the check before /bench-done (which would revive a record killed from the
    dashboard) is one /running, the same small request at any fleet size; the whole table is read
    only once the manager has said 404, to say why. A live record is never read."""
    reads: list[str] = []

    async def killed(uuid: str, *, stop_s: float | None = None) -> Any:
        reads.append(uuid)
        return {"uuid": uuid, "state": "killed", "kill_reason": "manually killed via UI"}

    alive, rig = reporter(random.Random(1))
    rig.manager.instance_record = killed
    await alive._check_alive()
    assert (rig.manager.pings, reads) == (1, [])
    assert not rig.signals.gone.is_set()

    gone, rig = reporter(random.Random(1))
    rig.manager.instance_record = killed

    async def not_found(uuid: str, *, stop_s: float | None = None) -> None:
        raise InstanceGone("running", uuid, "instance not found or already killed")

    rig.manager.running = not_found
    with pytest.raises(InstanceGone, match="manually killed via UI"):
        await gone._check_alive()
    assert reads == [UUID]
    assert rig.signals.gone.is_set()


async def test_an_unanswered_check_before_bench_done_sends_the_report_unchecked():
    rep, rig = reporter(random.Random(1), manager_status_read_s=1.0)

    async def away(uuid: str, *, stop_s: float | None = None) -> None:
        assert stop_s == 1.0  # manager_status_read_s bounds it
        raise ManagerUnavailable("running", 3, "connection refused")

    rig.manager.running = away
    await rep._check_alive()
    assert not rig.signals.gone.is_set()
