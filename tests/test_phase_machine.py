"""The phase machine (cuzk_supervisor.lifecycle.machine) with its collaborators faked.

Every transition and every way a run ends: each phase failing with its documented exit code and
a rate-0 report, the daemon failing to start, memory trouble stepping down, the manager's kill
in each phase (exit 7, nothing reported after it), verdicts that stand across a restart, and a
resume from the state file. No process, socket or clock: milliseconds each. The end-to-end
tests (tests/test_lifecycle_e2e.py and friends) keep the real behaviour covered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import Mapping, MutableMapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from phasefakes import UUID, MemoryStore, Rig, build, snapshot, stretch, trouble_in_bench
from structlog.testing import capture_logs

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.manager.values import ManagerRejected
from cuzk_supervisor.adapters.params import ParamsFailed
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE, RUNNING
from cuzk_supervisor.core.units import GIB
from cuzk_supervisor.lifecycle.monitors import Monitors
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, MemoryTrouble, Progress, Signals
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings import Settings

ALL_PHASES = ["register", "params", "plan", "warmup", "restart", "settle", "bench", "report",
              "run"]  # fmt: skip


def events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


# --- the whole run -------------------------------------------------------------------------


async def test_a_run_enters_every_phase_in_order_and_reports_each_once():
    rig = build()
    with capture_logs() as logs:
        code = await rig.run()
    assert code == exitcodes.OK
    assert rig.phases == ALL_PHASES
    assert rig.manager.kinds() == [PARAM_DONE, BENCH_DONE, RUNNING]
    # 6 proofs 10 s apart on 6 workers: 360 proofs/hour.
    assert rig.manager.rates() == [pytest.approx(360.0)]
    assert rig.daemon.calls == [("start", 2), ("replace", 6)]
    assert rig.fetch.calls == [(("p.params",), "fetch-params")]
    assert rig.daemon.source == "cuzk"
    assert rig.daemon.stopped
    state = rig.store.state
    assert (state.phase, state.uuid, state.params_verified, state.pce_ready) == (
        "run", UUID, True, True)  # fmt: skip
    assert state.plan is not None
    assert state.plan["full_workers"] == 6
    assert [b.rate for b in state.bench] == [pytest.approx(360.0)]
    assert state.verdict is None
    assert [e["phase"] for e in events(logs, "phase.entered")] == ALL_PHASES
    (result,) = events(logs, "bench.result")
    assert result["completed"] == 6
    assert result["workers"] == 6
    assert events(logs, "bench.passed")
    assert any(line.startswith("bench result: 360.00") for line in rig.shipper.texts("benchout"))


async def test_a_local_run_says_its_rate_was_not_judged_never_that_it_passed():
    """Before: without a manager URL the rate nobody judged was logged as ``bench.passed``."""
    rig = build(local=True)
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.phases == ALL_PHASES
    (unjudged,) = events(logs, "bench.unjudged")
    assert unjudged["rate"] == pytest.approx(360.0)
    assert not events(logs, "bench.passed")
    assert not [e for e in logs if e.get("passed") is True]


async def test_a_local_runs_answered_bench_is_not_called_passed_after_a_restart():
    answered = Report(kind=BENCH_DONE, uuid="local-C.test", rate=300.0, outcome=OUTCOME_OK,
                      passed=True)  # fmt: skip
    state = SupervisorState(uuid="local-C.test", params_verified=True, acked=(answered,))
    rig = build(store=MemoryStore(state), params_expected=(), local=True)
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    (again,) = events(logs, "bench.already_reported")
    assert (again["rate"], again["passed"], again["judged"]) == (300.0, None, False)


async def test_memory_in_the_bench_result_is_in_the_plans_gib():
    """Before: ``ram_gib`` was measured GiB, 0.2 for a simulator's 256 simulated GiB."""
    rig = build(host_total=256 << 20, plan_memory_scale=1024)  # as against the simulator
    rig.machine.monitors.last_memory = snapshot(256 << 20)  # type: ignore[misc]
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    (result,) = events(logs, "bench.result")
    assert (result["ram_gib"], result["cgroup_limit_gib"]) == (256.0, None)
    assert result["workers"] == 6  # the plan read the same 256 GiB


def test_the_status_lines_headroom_is_in_the_plans_gib():
    """Before: the demo's status line said "0.4 GiB memory headroom" of a 512 GiB machine."""
    progress = Progress()
    progress.phase, progress.phase_started = "warmup", 0.0
    for scale, shown, text in ((1024.0, 400.0, "400.0 GiB"), (1.0, 0.39, "0.4 GiB")):
        s = Settings(plan_memory_scale=scale)
        watch = SimpleNamespace(last=snapshot(400 << 20), level=SimpleNamespace(value="ok"))
        monitors = Monitors(s, progress=progress, signals=Signals(), watch=watch,  # type: ignore[arg-type]
                            gpu=None, metrics=SupervisorMetrics(),  # type: ignore[arg-type]
                            daemon=SimpleNamespace(restarts=0), manager=None,  # type: ignore[arg-type]
                            clock=lambda: 2.0)  # fmt: skip
        fields = monitors.status_fields()
        assert fields["headroom_gib"] == shown
        assert fields["text"] == f"warmup for 2s, 0 proofs done, {text} memory headroom (ok)"


async def test_no_restart_phase_when_the_warmup_plan_is_the_full_plan():
    rig = build(workers=2)  # override: full 2 = warmup 2
    assert await rig.run() == exitcodes.OK
    assert "restart" not in rig.phases
    assert rig.daemon.calls == [("start", 2)]


async def test_no_restart_phase_when_restart_after_warmup_is_off():
    rig = build(restart_after_warmup=False)
    assert await rig.run() == exitcodes.OK
    assert "restart" not in rig.phases
    # The settle and the bench run on the daemon the warmup started.
    assert rig.proofs.calls[-1] == ("bench", 2)


async def test_the_run_phase_keeps_going_until_the_manager_kills_the_instance():
    rig = build(exit_after_run=False)
    kill = _after(rig.daemon.kept, lambda: rig.machine.signals.mark_gone("killed: done"))
    tasks: list[asyncio.Future] = []
    rig.on_entering("run", lambda: tasks.append(asyncio.ensure_future(kill)))
    code = await rig.run()
    assert code == exitcodes.INSTANCE_GONE
    assert ("workers_kept", 0) in rig.daemon.calls
    assert rig.manager.kinds() == [PARAM_DONE, BENCH_DONE, RUNNING]
    assert rig.daemon.stopped
    assert rig.store.state.verdict is not None
    assert rig.store.state.verdict["exit_code"] == exitcodes.INSTANCE_GONE


async def test_a_crash_loop_in_the_run_phase_is_the_keepers_exit_code():
    rig = build(exit_after_run=False)
    crash = _after(
        rig.daemon.kept,
        lambda: rig.daemon.give_up(exitcodes.DAEMON_CRASH_LOOP, "5 failures in 60 s"),
    )
    tasks: list[asyncio.Future] = []
    rig.on_entering("run", lambda: tasks.append(asyncio.ensure_future(crash)))
    assert await rig.run() == exitcodes.DAEMON_CRASH_LOOP
    # The rate was reported: no rate-0 report follows it.
    assert rig.manager.rates() == [pytest.approx(360.0)]


async def test_a_signal_in_the_run_phase_ends_the_phases_with_nothing_left_unheard():
    """Before: cancelling the run (Ctrl-C) left the phases running; they saw the daemon's keeper
    stop under them and failed with LifecycleFailure('daemon: stopped') in a task nobody awaited:
    "Task exception was never retrieved" at exit."""
    rig = build(exit_after_run=False)
    loop = asyncio.get_running_loop()
    unheard: list[dict] = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unheard.append(context))
    try:
        task = asyncio.ensure_future(rig.run())
        await rig.daemon.kept.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(10):
            await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(old_handler)
    assert unheard == []
    assert rig.daemon.stopped
    assert rig.daemon.ended.result().reason == "stopped"
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


# --- each phase failing ----------------------------------------------------------------------


async def _fails(rig: Rig, code: int, phase: str) -> list[MutableMapping[str, Any]]:
    with capture_logs() as logs:
        assert await rig.run() == code
    assert rig.phases[-1] == phase
    (failed,) = events(logs, "lifecycle.failed")
    assert failed["phase"] == phase
    assert any(line.startswith(f"FAILED in {phase}: ") for line in rig.shipper.texts("setup"))
    assert rig.daemon.stopped
    return logs


async def test_register_rejected_is_an_unexpected_failure_with_nothing_reported():
    rig = build()
    rig.manager.register_error = ManagerRejected("register", 400, "bad label")
    logs = await _fails(rig, exitcodes.FAILURE, "register")
    assert "ManagerRejected" in events(logs, "supervisor.crashed")[0]["reason"]
    assert rig.manager.sent == []  # no uuid: nothing can be reported


async def test_params_that_cannot_be_fetched_exit_8_with_rate_0():
    rig = build()
    rig.fetch.error = ParamsFailed("fetch exited 1")
    await _fails(rig, exitcodes.PARAMS_FAILED, "params")
    assert rig.manager.rates() == [0.0]
    assert not rig.store.state.params_verified
    assert rig.store.state.failures[-1] == "params: fetch exited 1"
    assert rig.store.state.verdict is None  # not terminal: a restart tries again


async def test_a_plan_refused_for_memory_is_out_of_memory_and_stands():
    rig = build(host_total=64 * GIB)
    await _fails(rig, exitcodes.OUT_OF_MEMORY, "plan")
    assert rig.manager.rates() == [0.0]
    verdict = rig.store.state.verdict
    assert verdict is not None
    assert verdict["exit_code"] == exitcodes.OUT_OF_MEMORY
    assert verdict["reason"].startswith("plan refused: ")


async def test_a_daemon_that_fails_to_start_exits_3():
    rig = build()
    rig.daemon.fail["start"] = LifecycleFailure(
        exitcodes.DAEMON_FAILED_TO_START, "daemon: binary not found"
    )
    await _fails(rig, exitcodes.DAEMON_FAILED_TO_START, "warmup")
    assert rig.manager.rates() == [0.0]
    assert rig.store.state.verdict is None


async def test_a_crash_loop_at_the_restart_exits_4():
    rig = build()
    rig.daemon.fail["replace"] = LifecycleFailure(exitcodes.DAEMON_CRASH_LOOP, "daemon: loop")
    await _fails(rig, exitcodes.DAEMON_CRASH_LOOP, "restart")
    assert rig.manager.rates() == [0.0]


@pytest.mark.parametrize("phase", ["warmup", "settle"])
async def test_a_proof_that_keeps_failing_is_bench_failed_and_stands(phase):
    rig = build()
    rig.proofs.script[phase] = [LifecycleFailure(
        exitcodes.BENCH_FAILED, f"{phase} proof failed 3 times; last: boom")]  # fmt: skip
    await _fails(rig, exitcodes.BENCH_FAILED, phase)
    assert rig.manager.rates() == [0.0]
    assert rig.store.state.verdict is not None
    assert rig.store.state.verdict["reason"] == f"{phase} proof failed 3 times; last: boom"


async def test_a_bench_without_a_completed_proof_reports_rate_0():
    rig = build(completed=0)
    rig.machine.progress.last_failure = "bench proof failed: boom"
    logs = await _fails(rig, exitcodes.BENCH_FAILED, "report")
    assert events(logs, "bench.result")[0]["completed"] == 0
    assert rig.manager.rates() == [0.0]
    assert rig.store.state.bench[-1].completed == 0
    assert rig.store.state.verdict is not None
    assert "no benchmark proof completed" in rig.store.state.verdict["reason"]


async def test_a_rate_below_min_rate_is_bench_failed_without_running():
    rig = build(pass_rate=1000.0)
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.BENCH_FAILED
    assert rig.phases[-1] == "report"
    assert rig.manager.kinds() == [PARAM_DONE, BENCH_DONE]  # no rate-0 after the verdict
    (failed,) = events(logs, "bench.failed")
    assert failed["min_rate"] == 1000.0
    assert rig.store.state.verdict is not None
    assert "below min_rate" in rig.store.state.verdict["reason"]


async def test_an_unwritable_state_file_exits_9_and_still_tells_the_manager():
    rig = build()
    rig.store.fail = lambda state: state.plan is not None
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.STATE_UNWRITABLE
    assert events(logs, "state.unwritable")
    assert rig.phases[-1] == "plan"
    assert rig.manager.rates() == [0.0]  # sent directly, not through the (unsaveable) outbox


async def test_a_bug_in_a_collaborator_is_one_event_and_exit_1():
    rig = build()
    rig.proofs.script["settle"] = [RuntimeError("oops")]
    logs = await _fails(rig, exitcodes.FAILURE, "settle")
    (crashed,) = events(logs, "supervisor.crashed")
    assert crashed["reason"].startswith("unexpected RuntimeError: oops (phasefakes.py:")
    assert rig.manager.rates() == [0.0]


# --- memory trouble --------------------------------------------------------------------------


async def test_memory_trouble_in_the_warmup_steps_down_and_warms_up_again():
    rig = build()
    rig.proofs.script["warmup"] = [MemoryTrouble("memory critical: headroom 2%")]
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.phases[:5] == ["register", "params", "plan", "warmup", "warmup"]
    (step,) = events(logs, "plan.step_down")
    # From the 2 warmup workers running: 1 worker; the warmup is retried on the new plan's.
    assert (step["full_workers"], step["warmup_workers"]) == (1, 1)
    assert rig.daemon.calls[:3] == [("start", 2), ("forget_failures", 2), ("replace", 1)]
    assert rig.machine.progress.step_downs == 1
    assert rig.watch.acknowledged == 1
    assert rig.store.state.plan is not None
    assert rig.store.state.plan["step_downs"] == ["memory critical: headroom 2%"]
    assert rig.machine.signals.acted.is_set()
    assert not rig.machine.signals.trouble.is_set()


async def test_memory_trouble_in_the_bench_measures_anew_at_the_new_plan():
    rig = build()
    partial = stretch(6, 2)
    rig.proofs.script["bench"] = [trouble_in_bench(partial)]
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.phases[5:] == ["settle", "bench", "settle", "bench", "report", "run"]
    (step,) = events(logs, "plan.step_down")
    assert step["full_workers"] == 5
    assert ("replace", 5) in rig.daemon.calls  # the full plan: the PCE is built
    (result,) = events(logs, "bench.result")
    assert result["workers"] == 5
    assert result["measurement"]["step_downs"] == 1
    assert rig.machine.progress.stretch is None


async def test_memory_trouble_at_one_worker_is_out_of_memory_and_stands():
    rig = build(workers=1)
    rig.proofs.script["warmup"] = [MemoryTrouble("daemon OOM-killed (signal 9)")]
    await _fails(rig, exitcodes.OUT_OF_MEMORY, "warmup")
    verdict = rig.store.state.verdict
    assert verdict is not None
    assert verdict["exit_code"] == exitcodes.OUT_OF_MEMORY
    assert verdict["reason"].startswith("out of memory: out of memory at 1 partition worker")
    assert rig.manager.rates() == [0.0]


async def test_memory_trouble_in_the_run_phase_steps_down_and_keeps_running():
    rig = build(exit_after_run=False)
    signals = rig.machine.signals

    tasks: list[asyncio.Future] = []

    def trouble_then_kill() -> None:
        signals.flag_trouble("memory critical: rising", daemon_running=True)
        # Once the step-down is carried out (it sets ``acted``), the manager kills us.
        kill = _after(signals.acted, lambda: signals.mark_gone("killed: test"))
        tasks.append(asyncio.ensure_future(kill))

    rig.on_entering("run", trouble_then_kill)
    assert await rig.run() == exitcodes.INSTANCE_GONE
    assert rig.daemon.calls[-2:] == [("forget_failures", 6), ("replace", 5)]
    assert rig.machine.plan is not None
    assert rig.machine.plan.full_workers == 5


async def _after(event: asyncio.Event, action) -> None:
    await event.wait()
    action()


# --- the manager's kill ------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ALL_PHASES[1:])
async def test_a_kill_in_any_phase_ends_the_instance_with_7_and_nothing_more_reported(phase):
    rig = build(exit_after_run=False)
    rig.kill_in(phase)
    with capture_logs() as logs:
        code = await rig.run()
    assert code == exitcodes.INSTANCE_GONE
    after = rig.phases[rig.phases.index(phase) + 1 :]
    assert after == []
    sent = rig.manager.kinds()
    assert RUNNING not in sent or phase == "run"
    assert rig.manager.rates() in ([], [pytest.approx(360.0)])  # never a rate 0 for the dead
    if ALL_PHASES.index(phase) <= ALL_PHASES.index("report"):
        assert BENCH_DONE not in sent
    (gone,) = events(logs, "manager.instance_gone")
    assert gone["reason"] == "killed by the manager: test"
    assert not events(logs, "lifecycle.failed")
    assert rig.daemon.stopped
    assert rig.store.state.verdict is not None
    assert rig.store.state.verdict["exit_code"] == exitcodes.INSTANCE_GONE
    assert rig.store.state.failures[-1] == "instance gone: killed by the manager: test"


async def test_a_kill_found_before_the_bench_report_sends_no_rate():
    rig = build()
    rig.on_entering("report", lambda: setattr(rig.manager, "killed", "too slow"))
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.INSTANCE_GONE
    assert rig.manager.kinds() == [PARAM_DONE]
    reason = "killed by the manager: too slow"
    assert events(logs, "manager.instance_gone")[0]["reason"] == reason
    assert rig.store.state.verdict is not None
    assert rig.store.state.verdict["reason"] == f"instance gone: {reason}"


# --- verdicts that stand, and resuming from the state file -----------------------------------


TERMINAL = [({"host_total": 64 * GIB}, exitcodes.OUT_OF_MEMORY),
            ({"pass_rate": 1000.0}, exitcodes.BENCH_FAILED)]  # fmt: skip


@pytest.mark.parametrize(("settings", "code"), TERMINAL)
async def test_a_terminal_verdict_stands_on_the_next_start(settings, code):
    store = MemoryStore()
    assert await build(store=store, **settings).run() == code
    again = build(store=store)
    with capture_logs() as logs:
        assert await again.run() == code
    assert again.phases == ["finished"]
    assert again.manager.sent == []
    assert again.fetch.calls == []
    assert again.daemon.calls == []
    (finished,) = events(logs, "lifecycle.finished")
    assert finished["exit_code"] == code
    assert again.machine.last_failure.startswith("finished: ")
    assert any(line.startswith("finished earlier: ") for line in again.shipper.texts("setup"))
    assert again.shipper.uuid == UUID


async def test_a_terminal_verdict_without_exit_after_run_stays_up_until_stopped():
    store = MemoryStore(SupervisorState(uuid=UUID, verdict={"exit_code": 6, "reason": "slow"}))
    rig = build(store=store, exit_after_run=False)
    finished = asyncio.Event()
    rig.on_entering("finished", finished.set)
    task = asyncio.ensure_future(rig.run())
    await finished.wait()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_params_already_verified_are_not_fetched_again():
    store = MemoryStore(SupervisorState(uuid=UUID, params_verified=True))
    rig = build(store=store, params_expected=())
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.fetch.calls == []
    assert events(logs, "params.already_verified")


async def test_params_already_verified_are_checked_but_not_fetched():
    store = MemoryStore(SupervisorState(uuid=UUID, params_verified=True))
    rig = build(store=store)
    assert await rig.run() == exitcodes.OK
    assert rig.fetch.calls == [(("p.params",), "")]


async def test_an_answered_bench_is_not_rerun_after_a_restart():
    answered = Report(kind=BENCH_DONE, uuid=UUID, rate=300.0, outcome=OUTCOME_OK, passed=True)
    store = MemoryStore(SupervisorState(uuid=UUID, params_verified=True, acked=(answered,)))
    rig = build(store=store, params_expected=())
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.phases == ["register", "params", "plan", "run"]
    assert rig.daemon.calls == [("start", 6)]
    assert rig.proofs.calls == []
    assert BENCH_DONE not in rig.manager.kinds()
    assert events(logs, "bench.already_reported")[0]["rate"] == 300.0
    assert rig.daemon.source == "cuzk"


async def test_a_failed_answered_bench_ends_at_once_after_a_restart():
    answered = Report(kind=BENCH_DONE, uuid=UUID, rate=3.0, outcome=OUTCOME_OK, passed=False)
    store = MemoryStore(SupervisorState(uuid=UUID, params_verified=True, acked=(answered,)))
    rig = build(store=store, params_expected=())
    assert await rig.run() == exitcodes.BENCH_FAILED
    assert rig.phases == ["register", "params"]
    assert rig.daemon.calls == []


async def test_a_report_left_queued_is_sent_first_and_the_bench_reports_its_rate():
    # A crash after the bench result was queued: the queued rate is sent, not a new one.
    queued = Report(kind=BENCH_DONE, uuid=UUID, rate=123.0)
    store = MemoryStore(SupervisorState(uuid=UUID, params_verified=True, outbox=(queued,)))
    rig = build(store=store, params_expected=())
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    assert rig.manager.rates()[0] == 123.0
    assert events(logs, "manager.outbox_resent")
    assert rig.phases == ["register", "params", "plan", "run"]


async def test_a_new_uuid_at_register_keeps_only_the_params():
    old = SupervisorState(uuid="old-uuid", params_verified=True, pce_ready=True,
                          verdict=None, failures=("earlier",))  # fmt: skip
    rig = build(store=MemoryStore(old), params_expected=())
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    (new,) = events(logs, "manager.new_instance")
    assert (new["old_uuid"], new["uuid"]) == ("old-uuid", UUID)
    assert rig.store.state.failures == ()
    assert rig.fetch.calls == []  # the params on disk carry over
    assert rig.phases == ALL_PHASES


async def test_register_waits_for_the_manager_and_counts_the_attempts():
    rig = build()
    rig.manager.unavailable_registers = 3
    with capture_logs() as logs:
        assert await rig.run() == exitcodes.OK
    waiting = events(logs, "manager.register_waiting")
    assert len(waiting) == 3
    # info: the manager client's own warnings name the URL at a steady cadence (before: a
    # second warning every register_stop_s on top of them).
    assert {e["log_level"] for e in waiting} == {"info"}
    progress = rig.machine.progress
    # Each failed call: one attempt inside the client (its listener), one that ended it.
    assert progress.register_failures == 6
    assert progress.register_retry_at is None  # registered: no wait any more


def test_the_rig_builds_what_it_says():
    rig = build()
    assert rig.machine.outbox is rig.reporter.outbox
    assert rig.machine.keeper is None
    assert dataclasses.is_dataclass(rig.store.state)
