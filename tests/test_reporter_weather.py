"""Issue 31 phase by phase: the reporter (the lifecycle's side of the manager) with the real
manager client over the scripted manager. Weather in any phase never ends the instance and is
never switched off by one answer: the register waits it out, ``/param-done`` stays queued and
is applied once, the kill look-up before ``/bench-done`` asks again next time, ``/bench-done``
is retried, the run phase's ``/running`` ping goes on. Only the manager's JSON 404 or our record
in state ``killed`` ends it. (The client's rules for every answer shape: test_manager_weather.)
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from phasefakes import FakeShipper, MemoryStore
from scripted import FAST, ScriptedManager, TickingClock
from test_manager_weather import WEATHER, weather_step

from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.state.doc import SupervisorState
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.core.reports import OUTCOME_OK, PARAM_DONE
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.values import ReporterSettings
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy

KINDS = sorted(WEATHER)


def rig(manager: ScriptedManager, phase: str, **settings: Any) -> tuple[Reporter, Signals]:
    retry = dataclasses.replace(FAST, report_stop_s=1000.0, register_stop_s=1000.0)
    clock = TickingClock(manager, 5.0)
    client = manager.client(retry=retry, clock=clock)
    keeper = StateKeeper(MemoryStore(SupervisorState()))  # type: ignore[arg-type]
    progress, signals = Progress(), Signals()
    progress.phase = phase
    rep = Reporter(
        policy(ReporterSettings, Settings(**settings)),
        label="C.1", min_rate=30.0, manager=client, state=keeper,
        outbox=Outbox.for_keeper(client, keeper), shipper=FakeShipper(),  # type: ignore[arg-type]
        signals=signals, progress=progress, retries=LifecycleRetries(), clock=clock,
        rng=random.Random(1),
    )  # fmt: skip
    return rep, signals


def weather(manager: ScriptedManager, path: str, kind: str, times: int = 3) -> None:
    manager.fail(path, *[weather_step(kind, path)] * times)


@pytest.mark.parametrize("kind", KINDS)
async def test_register_waits_the_weather_out(kind):
    manager = ScriptedManager()
    weather(manager, "/register", kind)
    rep, _ = rig(manager, "register")
    await rep.register()
    assert rep.uuid == "u-1"
    assert manager.paths() == ["/register"] * 4


@pytest.mark.parametrize("kind", KINDS)
async def test_param_done_in_weather_is_kept_and_applied_once(kind):
    manager = ScriptedManager()
    rep, signals = rig(manager, "params")
    await rep.register()
    weather(manager, "/param-done", kind)
    await rep.params_done()  # queued, durable; the outbox task sends it
    assert [r.kind for r in rep.outbox.pending] == [PARAM_DONE]
    result = await rep.outbox.drain()
    assert result.pending == 0
    assert not signals.gone.is_set()
    assert manager.paths().count("/param-done") == 4
    report = rep.outbox.latest(PARAM_DONE)
    assert report is not None
    assert report.outcome == OUTCOME_OK


@pytest.mark.parametrize("kind", KINDS)
async def test_the_kill_look_up_in_weather_is_asked_again_next_time(kind):
    manager = ScriptedManager()
    rep, signals = rig(manager, "bench", manager_status_read_s=10.0)
    await rep.register()
    weather(manager, "/status", kind, times=1000)
    assert await rep.look_up_kill(stop_s=10.0) is None  # not looked up: weather
    manager.steps["/status"].clear()
    assert manager.record is not None
    manager.record.update(state="killed", kill_reason="manually killed via UI")
    assert await rep.look_up_kill(stop_s=10.0) == "killed by the manager: manually killed via UI"
    assert not signals.gone.is_set()  # the caller marks it


@pytest.mark.parametrize("kind", KINDS)
async def test_bench_done_in_weather_is_retried_until_the_verdict(kind):
    manager = ScriptedManager(min_rate=30.0)
    rep, signals = rig(manager, "report")
    await rep.register()
    weather(manager, "/status", kind)
    weather(manager, "/bench-done", kind)
    done = await rep.bench_done(60.0)
    assert done.passed is True
    assert manager.paths().count("/bench-done") == 4
    assert not signals.gone.is_set()


@pytest.mark.parametrize("kind", KINDS)
async def test_the_run_phase_ping_in_weather_never_ends_the_instance(kind):
    manager = ScriptedManager()
    rep, signals = rig(manager, "run", running_ping_interval_s=60.0)
    await rep.register()
    await rep.running()
    for _ in range(3):
        weather(manager, "/running", kind, times=1000)
        assert await rep.ping(stop_s=12.0)  # its stop runs out in the weather: alive
    manager.steps["/running"].clear()
    assert await rep.ping(stop_s=12.0)
    assert not signals.gone.is_set()


async def test_the_managers_json_404_on_the_ping_ends_the_instance_with_its_record():
    manager = ScriptedManager()
    rep, signals = rig(manager, "run")
    await rep.register()
    await rep.running()
    assert manager.record is not None
    manager.record.update(state="killed", kill_reason="manually killed via UI")
    assert not await rep.ping(stop_s=12.0)
    assert signals.gone.is_set()
    assert signals.gone_reason == "killed by the manager: manually killed via UI"


async def test_a_killed_record_before_bench_done_ends_the_instance_unsent():
    manager = ScriptedManager()
    rep, signals = rig(manager, "report")
    await rep.register()
    assert manager.record is not None
    manager.record.update(state="killed", kill_reason="benchmark timeout (45min)")
    with pytest.raises(Exception, match="benchmark timeout"):
        await rep.bench_done(60.0)
    assert signals.gone.is_set()
    assert "/bench-done" not in manager.paths()
