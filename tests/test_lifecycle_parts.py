"""The phase machine's collaborators alone, each over fakes at its edge: proof attempts under
their retry policy (cuzk_supervisor.lifecycle.proofs), the step-down (stepdown), manager
reporting and the wait for /register (reporting), the status line (monitors), and the retry
policy values (retries)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from phasefakes import UUID, FakeDaemon, FakeManager, FakeShipper, MemoryStore, World, proof
from structlog.testing import capture_logs

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import ManagerRejected, ManagerUnavailable
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.core.bench import BenchPolicy, Stretch
from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import plan_workers
from cuzk_supervisor.core.reports import RUNNING
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.core.units import GIB, MIB
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.lifecycle.monitors import Monitors, status_text
from cuzk_supervisor.lifecycle.proofs import ProofRunner
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries, Retry
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, MemoryTrouble, Progress, Signals
from cuzk_supervisor.lifecycle.stepdown import StepDown
from cuzk_supervisor.lifecycle.values import ReporterSettings
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy as settings_policy

# --- proof attempts ------------------------------------------------------------------------


class ScriptedClient:
    """A prover whose n-th ``prove`` does ``script[n]``: a result, or a function of the
    signals that raises an event and never answers (the daemon died under the proof)."""

    def __init__(self, script: list[Any], signals: Signals) -> None:
        self.script = script
        self.signals = signals
        self.calls = 0

    async def prove(self, request: Any, budget_s: float | None) -> Any:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        await asyncio.sleep(0)
        if callable(step):
            step(self.signals)
            await asyncio.Event().wait()
        return step


def runner(script: list[Any], *, attempts: int = 3) -> tuple[ProofRunner, Any]:
    world, signals, progress = World(), Signals(), Progress(phase="warmup")
    daemon = FakeDaemon(world)
    readies: list[int] = []

    async def ready() -> None:
        readies.append(1)

    daemon.ready = ready  # type: ignore[attr-defined]
    client = ScriptedClient(script, signals)

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Any]:
        yield client

    proofs = ProofRunner(
        daemon=daemon, client_factory=connect, c1_file=None,  # type: ignore[arg-type]
        signals=signals, progress=progress, metrics=SupervisorMetrics(),
        shipper=FakeShipper(),  # type: ignore[arg-type]
        retry=Retry("proof", attempts=attempts), proof_budget_s=60.0, rate_time_scale=1.0,
    )  # fmt: skip
    proofs._request = pb.SubmitProofRequest()  # no C1 file to read
    return proofs, SimpleNamespace(signals=signals, progress=progress, daemon=daemon,
                                   client=client, readies=readies)  # fmt: skip


async def test_a_proof_that_fails_is_tried_three_times_then_ends_the_bench():
    proofs, rig = runner([proof(ok=False, error="boom")])
    with capture_logs() as logs, pytest.raises(LifecycleFailure) as failure:
        await proofs.prove(60.0)
    assert failure.value.exit_code == exitcodes.BENCH_FAILED
    assert failure.value.reason == "warmup proof failed 3 times; last: boom"
    attempts = [e for e in logs if e["event"] == "proof.attempt_failed"]
    assert [(e["attempt"], e["of"]) for e in attempts] == [(1, 3), (2, 3), (3, 3)]
    assert rig.progress.proofs_failed == 3
    assert rig.progress.last_failure == "warmup proof failed: boom"


async def test_a_proof_that_succeeds_on_its_second_attempt_is_returned():
    proofs, rig = runner([proof(ok=False, error="boom"), proof(wall_s=2.0)])
    result = await proofs.prove(60.0)
    assert result.ok
    assert (rig.progress.proofs_done, rig.progress.proofs_failed) == (1, 1)


async def test_the_attempts_are_the_policys():
    proofs, _ = runner([proof(ok=False, error="boom")], attempts=1)
    with pytest.raises(LifecycleFailure, match="failed 1 times"):
        await proofs.prove(60.0)


async def test_a_daemon_restart_under_a_proof_is_not_an_attempt():
    def crash(signals: Signals) -> None:
        signals.daemon_exit("daemon crashed (exit 101)")

    proofs, rig = runner([crash, proof(ok=False, error="boom")])
    with capture_logs() as logs, pytest.raises(LifecycleFailure):
        await proofs.prove(60.0)
    assert rig.client.calls == 4  # the lost one, then three attempts
    assert rig.readies == [1]  # resubmitted once the new daemon answered
    (restarted,) = [e for e in logs if e["event"] == "proof.daemon_restarted"]
    assert restarted["cause"] == "daemon crashed (exit 101)"


async def test_memory_trouble_under_a_proof_interrupts_it():
    proofs, _ = runner(
        [lambda signals: signals.flag_trouble("memory critical: 2% left", daemon_running=True)]
    )
    with pytest.raises(MemoryTrouble) as trouble:
        await proofs.prove(60.0)
    assert trouble.value.cause == "memory critical: 2% left"


async def test_a_keeper_that_gave_up_under_a_proof_is_its_verdict():
    def give_up(signals: Signals) -> None:
        rig.daemon.give_up(exitcodes.DAEMON_CRASH_LOOP, "5 failures in 60 s")

    proofs, rig = runner([give_up])
    with pytest.raises(LifecycleFailure) as failure:
        await proofs.prove(60.0)
    assert failure.value.exit_code == exitcodes.DAEMON_CRASH_LOOP
    assert failure.value.reason == "daemon: 5 failures in 60 s"


async def test_a_daemon_restart_mid_stretch_ends_it_interrupted_with_its_completions():
    def crash(signals: Signals) -> None:
        signals.daemon_exit("daemon crashed")

    proofs, rig = runner([proof(), proof(), crash])
    policy = BenchPolicy(max_proofs=6, concurrency=2, min_proofs=2)
    with capture_logs() as logs:
        stretch = await proofs.stretch(policy, 4, lambda: float("inf"))
    assert stretch.interrupted == "daemon crashed"
    assert len(stretch.completions) == 2
    assert rig.readies == [1]
    assert rig.progress.stretch is None
    assert [e["event"] for e in logs if e["event"].startswith("bench.")] == [
        "bench.started", "bench.interrupted", "bench.stretch_done"]  # fmt: skip


# --- the step-down -------------------------------------------------------------------------


def _plan(host_gib: int = 256) -> Any:
    policy = settings_policy(MemoryPolicy, Settings())
    inputs = PlanInputs(host_total_bytes=host_gib * GIB, cgroup_limit_bytes=None,
                        gpu_vram_total_bytes=(), workers_override=None,
                        memory_scale=1.0)  # fmt: skip
    return plan_workers(inputs, policy), policy


def _measured_watch() -> Any:
    """A memory watch that measured 930 of 960 MiB used over an idle base of 330 MiB."""
    watch = SimpleNamespace(
        policy=RiskPolicy(), base_bytes=330 * MIB, plateau_bytes=None, acknowledge=lambda: None,
        assessment=SimpleNamespace(limit_bytes=960 * MIB, used_bytes=930 * MIB,
                                   slope_bytes_per_s=None),
    )  # fmt: skip
    return watch


async def test_a_measured_fit_steps_down_to_what_fits_and_sets_the_plateau():
    plan, policy = _plan()  # 6 workers
    world, signals, progress = World(), Signals(), Progress(phase="bench")
    daemon = FakeDaemon(world)
    daemon.workers = 6
    watch = _measured_watch()
    step = StepDown(daemon=daemon, watch=watch, signals=signals, progress=progress,
                    memory_policy=policy, active_partitions=lambda: 10)  # fmt: skip
    signals.flag_trouble("memory critical", daemon_running=True)
    with capture_logs() as logs:
        new, fit = await step.next_plan(plan, "memory critical")
        await step.relaunch(new, fit)
    assert fit is not None
    assert new.full_workers == fit.workers == 5  # 7 fit; never above one step down from 6
    assert [e["event"] for e in logs] == ["memory.fit", "plan.step_down"]
    assert daemon.calls == [("forget_failures", 6), ("replace", 5)]  # bench: the full plan
    assert watch.plateau_bytes == round(fit.base + 5 * fit.per_partition)
    assert not signals.trouble.is_set()
    assert signals.acted.is_set()
    assert progress.step_downs == 1


@pytest.mark.parametrize(
    ("phase", "stretch", "workers"),
    [
        ("warmup", None, 4),  # its one proof: 10 partitions, 6 on 6 workers
        ("bench", Stretch(6, 2, 0.0, completions=(1.0,), submitted=3), 4),  # 2 in flight
        ("bench", Stretch(6, 2, 0.0, completions=(1.0, 2.0), submitted=2), 5),  # none in flight
        ("run", None, 5),  # the run phase's proofs come from outside: not known
        ("warmup-oom-killed", None, 5),  # a kill, not a critical level: one step, as before
    ],
)
async def test_where_the_daemons_status_does_not_answer_the_fit_counts_the_proofs_running(
    phase: str, stretch: Stretch | None, workers: int
) -> None:
    """The daemon's status timed out (under memory pressure): the active partitions are
    estimated from the proofs the lifecycle had running there, so the step still goes to what
    fits (4: 100 MiB a partition over 330 MiB, 80% of 960 MiB) and not one worker at a time.
    After an OOM kill the sample before it says little of what killed it: one step."""
    plan, policy = _plan()  # 6 workers
    daemon = FakeDaemon(World())
    daemon.workers = 6
    watch = _measured_watch()
    killed = phase.endswith("-oom-killed")
    progress = Progress(phase=phase.removesuffix("-oom-killed"), stretch=stretch)
    signals = Signals()
    signals.flag_trouble("the cause", daemon_running=not killed)
    step = StepDown(daemon=daemon, watch=watch, signals=signals, progress=progress,
                    memory_policy=policy, active_partitions=lambda: None)  # fmt: skip
    new, fit = await step.next_plan(plan, "the cause")
    assert new.full_workers == workers
    assert (fit is not None) == (workers == 4)
    if fit is not None:
        assert fit.active_estimated


async def test_a_step_down_before_any_daemon_only_changes_the_plan():
    plan, policy = _plan()
    daemon = FakeDaemon(World())
    watch = SimpleNamespace(policy=RiskPolicy(), base_bytes=None, plateau_bytes=1,
                            assessment=None, acknowledge=lambda: None)  # fmt: skip
    step = StepDown(daemon=daemon, watch=watch, signals=Signals(), progress=Progress(),
                    memory_policy=policy,
                    active_partitions=lambda: pytest.fail("asked"))  # fmt: skip
    new, fit = await step.next_plan(plan, "cause")
    await step.relaunch(new, fit)
    assert (new.full_workers, fit) == (5, None)
    assert daemon.calls == []
    assert watch.plateau_bytes is None


# --- manager reporting and the wait for /register ----------------------------------------------


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reporter(*, state: SupervisorState | None = None, **settings: Any) -> Any:
    world, signals, progress = World(), Signals(), Progress()
    manager = FakeManager(world)
    keeper = StateKeeper(MemoryStore(state))  # type: ignore[arg-type]
    clock, wall = Clock(), Clock(1_000_000.0)
    s = Settings(label="C.test", **settings)
    rep = Reporter(
        settings_policy(ReporterSettings, s), label="C.test", min_rate=1.0,
        manager=manager, state=keeper,  # type: ignore[arg-type]
        outbox=Outbox.for_keeper(manager, keeper), shipper=FakeShipper(),  # type: ignore[arg-type]
        signals=signals, progress=progress, retries=LifecycleRetries(), clock=clock,
        wall_clock=wall,
    )  # fmt: skip
    manager.add_retry_listener(rep.on_manager_retry)
    watch = MemoryWatch(SimpleNamespace(), RiskPolicy(), lambda: None)  # type: ignore[arg-type]
    monitors = Monitors(s, progress=progress, signals=signals, watch=watch, gpu=None,  # type: ignore[arg-type]
                        metrics=SupervisorMetrics(), daemon=SimpleNamespace(restarts=0),
                        manager=rep, clock=clock)  # fmt: skip
    return rep, SimpleNamespace(manager=manager, signals=signals, progress=progress,
                                clock=clock, wall=wall, monitors=monitors)  # fmt: skip


async def test_the_status_line_shows_the_register_wait():
    rep, rig = reporter()
    rig.progress.phase = "register"
    rig.progress.phase_started = rig.clock.now
    assert "register_failures" not in rig.monitors.status_fields()
    rep.on_manager_retry("register", 1, 4.0)
    rep.on_manager_retry("log_push", 1, 9.0)  # another call: not the register wait
    rig.clock.now += 1.5
    fields = rig.monitors.status_fields()
    assert (fields["register_failures"], fields["register_retry_in_s"]) == (1, 2.5)
    assert "register failed 1 time(s), next try in 2s" in fields["text"]
    rig.clock.now += 10
    assert rig.monitors.status_fields()["register_retry_in_s"] == 0.0


async def test_register_counts_every_failed_attempt_then_clears_the_wait():
    rep, rig = reporter()
    rig.progress.phase = "register"
    rig.manager.unavailable_registers = 2
    await rep.register()
    assert rep.uuid == UUID
    assert rig.progress.register_failures == 4
    assert rig.progress.register_retry_at is None


def test_the_status_text_of_a_register_wait_without_a_known_pause():
    fields = {"phase": "register", "elapsed_s": 3.0, "proofs_done": 0, "register_failures": 2,
              "register_retry_in_s": None}  # fmt: skip
    assert status_text(fields) == "register for 3s, 0 proofs done, register failed 2 time(s)"


async def test_a_report_waits_for_the_manager_under_its_policy():
    rep, rig = reporter(state=SupervisorState(uuid=UUID))
    rep.uuid = UUID
    failures = [ManagerUnavailable("running", 3, "refused")] * 2

    async def send(report: Report, *, stop_s: float | None = None) -> Report:
        if failures:
            raise failures.pop()
        return await FakeManager.send(rig.manager, report, stop_s=stop_s)

    rig.manager.send = send
    with capture_logs() as logs:
        await rep.running()
    assert [e["event"] for e in logs].count("manager.report_waiting") == 2
    assert rig.manager.kinds() == [RUNNING]


async def test_a_report_the_manager_rejects_is_logged_and_given_up():
    rep, rig = reporter(state=SupervisorState(uuid=UUID))
    rep.uuid = UUID

    async def send(report: Report, *, stop_s: float | None = None) -> Report:
        raise ManagerRejected(report.kind, 400, "bad uuid")

    rig.manager.send = send
    report = Report(kind=RUNNING, uuid=UUID)
    with capture_logs() as logs:
        done = await rep.send(report)
    assert done.id == report.id
    assert any(e["event"] == "manager.report_rejected" for e in logs)


async def test_the_bench_deadline_follows_the_managers_clock():
    rep, rig = reporter()
    assert rep.bench_deadline() == rig.clock.now + 2700.0  # not acknowledged: all ahead
    started = SupervisorState(bench_clock_start=rig.wall.now - 700.0)
    rep, rig = reporter(state=started)
    assert rep.bench_deadline() == rig.clock.now + 2000.0


async def test_a_ping_answered_404_marks_the_instance_gone():
    rep, rig = reporter(state=SupervisorState(uuid=UUID))
    rep.uuid = UUID
    assert not rep.ping_due()  # no /running yet: the first report comes first
    await rep.running()
    rig.clock.now += 300
    assert rep.ping_due()
    from cuzk_supervisor.adapters.manager.values import InstanceGone

    async def running(uuid: str, *, stop_s: float | None = None) -> None:
        raise InstanceGone("running", uuid, "no such instance")

    rig.manager.running = running
    assert await rep.ping(stop_s=1.0) is False
    assert rig.signals.gone_reason == "/running answered: no such instance"
    assert not rep.ping_due()


async def test_a_kill_is_looked_up_in_the_managers_record():
    rep, rig = reporter()
    assert await rep.look_up_kill(stop_s=1) is None  # no uuid yet: nothing to look up
    rep.uuid = UUID
    assert await rep.look_up_kill(stop_s=1) is None
    rig.manager.killed = "too slow"
    assert await rep.look_up_kill(stop_s=1) == "killed by the manager: too slow"


# --- retry policies ---------------------------------------------------------------------------


def test_retry_policies_are_values():
    assert LifecycleRetries() == LifecycleRetries()
    assert LifecycleRetries().proof == Retry("proof", attempts=3)
    assert LifecycleRetries().register.attempts is None
    assert "attempts=3" in repr(LifecycleRetries().proof)
    with pytest.raises(ValueError, match="attempts"):
        Retry("x", attempts=0)
    with pytest.raises(ValueError, match="pause_s"):
        Retry("x", pause_s=-1)


async def test_a_retry_controller_stops_where_the_policy_says():
    from tenacity import retry_if_exception_type

    calls = []

    async def flaky() -> None:
        calls.append(1)
        raise KeyError("again")

    retrying = Retry("t", attempts=4).controller(retry_if_exception_type(KeyError))
    with pytest.raises(KeyError):
        await retrying(flaky)
    assert len(calls) == 4
