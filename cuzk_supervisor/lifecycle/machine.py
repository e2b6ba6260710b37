"""The phase machine: register, params, plan, warmup, restart, settle, bench, report, run.

The only module that knows the order of phases (docs/architecture.md); it reads top to bottom in
that order. The paths that end a run (a failure, the manager's kill, a verdict that stands) are its
base's, :class:`~cuzk_supervisor.lifecycle.endings.RunEndings`. Everything it does to the world
goes through a collaborator it is given (:mod:`.ports`; built in :mod:`cuzk_supervisor.compose`).
Every transition is written to the state file before anyone is told, logged, and shipped to the
manager's log endpoint. Failures are values with reasons: a benchmark that cannot complete reports
rate 0 with the reason (never silence, incident I2) and ends with a documented exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from cuzk_supervisor import exitcodes, logcontext
from cuzk_supervisor.adapters import params
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.core import bench
from cuzk_supervisor.core.benchclock import room_to_measure
from cuzk_supervisor.core.benchreport import RateMeasurement, choose_measurement
from cuzk_supervisor.core.bound import Shape, Verdict, judge
from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import PlanRefusal, WorkerPlan, memory_fit, plan_workers
from cuzk_supervisor.daemon.keeper import DaemonKeeper
from cuzk_supervisor.deadline import within
from cuzk_supervisor.lifecycle import ports
from cuzk_supervisor.lifecycle.benchrun import bench_result
from cuzk_supervisor.lifecycle.endings import RunEndings
from cuzk_supervisor.lifecycle.healthwatch import Unwatched
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, MemoryTrouble, Progress, Signals
from cuzk_supervisor.lifecycle.values import PhaseSettings
from cuzk_supervisor.serve.metricsink import MetricsSink

log = structlog.get_logger()


@dataclass(eq=False, kw_only=True)
class Lifecycle(RunEndings):
    """The phases in order, given its collaborators (all of them shared with each other through
    ``progress`` and ``signals``)."""

    config: PhaseSettings
    state: StateKeeper
    shipper: LogShipper
    metrics: MetricsSink
    memory_policy: MemoryPolicy
    bench_policy: bench.BenchPolicy
    progress: Progress
    signals: Signals
    resources: ports.Resources
    fetch_params: ports.FetchParams
    daemon: ports.Daemon
    proofs: ports.Proofs
    stepdown: ports.StepDowns
    reporter: ports.Reports
    monitors: ports.Watchers
    health: ports.Health = field(default_factory=Unwatched)
    release_memory: Callable[[], None] = field(default=lambda: None)
    """Called as the run phase begins: what the phases before it left free goes back to the
    system (``adapters.machine.heap``; the composition root gives it)."""
    plan: WorkerPlan | None = field(default=None, init=False)
    phase_listeners: list[Callable[[str], None]] = field(default_factory=list, init=False)
    last_verdict_reason: str = field(default="", init=False)

    # What /readyz and /metrics read (LifecycleSource below, compose.run).
    @property
    def keeper(self) -> DaemonKeeper | None:
        return self.daemon.keeper

    @property
    def outbox(self) -> Outbox:
        return self.reporter.outbox

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> int:
        async with asyncio.TaskGroup() as group:
            shipper_task = group.create_task(self.shipper.run())
            loops = [group.create_task(loop()) for loop in self.monitors.loops()]
            loops.append(group.create_task(self.reporter.outbox_loop()))
            try:
                return await self._run_guarded()
            finally:
                await self.daemon.stop()
                for task in loops:
                    task.cancel()
                self.shipper.stop()
                with contextlib.suppress(TimeoutError):
                    await within(asyncio.shield(shipper_task), 10)

    async def _phases(self) -> int:
        await self.reporter.resend()
        await self._register()
        await self._params()
        answered = self.reporter.answered_bench()
        if answered is not None:
            # A finished and answered benchmark is not rerun after a restart.
            log.info("bench.already_reported", **self.reporter.verdict_fields(answered))
            self.metrics.bench_rate(answered.rate or 0.0)
            self.daemon.source = "cuzk"
            if not answered.passed:
                return exitcodes.BENCH_FAILED
            self.reporter.reported = True
            await self._plan()
            await self.daemon.start(self._plan_now(), self._plan_now().full_workers)
            return await self._run_phase()
        await self._plan()
        await self._warmup()
        await self._restart()
        measurement = await self._settle_and_bench()
        if not await self._report(measurement):
            return exitcodes.BENCH_FAILED
        return await self._run_phase()

    # --- phases, in order -------------------------------------------------------------------

    async def _register(self) -> None:
        await self._enter("register")
        await self.reporter.register()

    async def _params(self) -> None:
        await self._enter("params")
        expected = params.parse_expected(self.config.params_expected)
        already = self.state.state.params_verified
        if already and not expected:
            log.info("params.already_verified")
        else:
            fetch_command = "" if already else self.config.params_fetch_command
            try:
                await self.fetch_params(expected, fetch_command)
            except params.ParamsFailed as exc:
                raise LifecycleFailure(exitcodes.PARAMS_FAILED, f"params: {exc}") from None
        if not already:
            await self.state.update(
                lambda st: dataclasses.replace(st, params_verified=True, params_done_at=time.time())
            )
        await self.reporter.params_done()

    async def _plan(self) -> None:
        await self._enter("plan")
        snapshot = self.resources.sample()
        devices = await self.resources.gpus()
        inputs = PlanInputs(
            host_total_bytes=snapshot.host_total, cgroup_limit_bytes=snapshot.cgroup_limit,
            gpu_vram_total_bytes=tuple(d.total_bytes for d in devices),
            workers_override=self.config.workers or None,
            memory_scale=self.config.plan_memory_scale,
        )  # fmt: skip
        result = plan_workers(inputs, self.memory_policy)
        if isinstance(result, PlanRefusal):
            raise LifecycleFailure(exitcodes.OUT_OF_MEMORY, f"plan refused: {result.reason}")
        await self._adopt(result)

    async def _warmup(self) -> None:
        """One warmup proof (it builds the PCE); memory trouble steps down and warms up again."""
        while True:
            try:
                await self._enter("warmup")
                plan = self._plan_now()
                await self.daemon.start(plan, plan.warmup_workers)
                warm = await self.proofs.prove(self.config.warmup_budget_s)
                break
            except MemoryTrouble as trouble:
                await self._step_down(trouble.cause)
        await self.state.update(lambda st: dataclasses.replace(st, pce_ready=True))
        log.info("warmup.done", wall_s=round(warm.wall_s, 3), workers=plan.warmup_workers)

    async def _restart(self) -> None:
        plan = self._plan_now()
        if self.config.restart_after_warmup and plan.full_workers != plan.warmup_workers:
            await self._enter("restart")
            await self.daemon.replace(plan, plan.full_workers)

    async def _settle_and_bench(self) -> RateMeasurement:
        """Settle, then one stretch of proofs sized to the budget as it runs (core.bench). A
        daemon restart or a step-down inside the bench ends the stretch (the proofs in flight are
        lost time, not throughput); settled again, a new stretch measures anew while the budget
        allows one; the rate comes from ``core.benchreport.choose_measurement``."""
        stretches: list[bench.Stretch] = []
        settle_s = 0.0
        while True:
            try:
                await self._enter("settle")
                settle = await self.proofs.prove(self.config.proof_budget_s)
                settle_s = settle.wall_s
                log.info("settle.done", wall_s=round(settle_s, 3), workers=self._workers())
                await self._enter("bench")
                deadline = self.reporter.bench_deadline
                stretches.append(
                    await self.proofs.stretch(self.bench_policy, self._workers(), deadline)
                )
            except MemoryTrouble as trouble:
                stretch = self.progress.stretch
                if stretch is not None and self.progress.phase == "bench":
                    stretches.append(stretch.interrupt(f"step-down: {trouble.cause}"))
                # The step-down reads the stretch's proofs in flight (stepdown.proofs_running).
                await self._step_down(trouble.cause)
                self.progress.stretch = None
            if stretches and not stretches[-1].interrupted:
                break
            remaining_s = self.reporter.bench_deadline() - time.monotonic()
            if not room_to_measure(stretches, settle_s, remaining_s, self.bench_policy):
                log.warning("bench.no_time_to_measure_again", stretches=len(stretches))
                break
        return choose_measurement(stretches, self.bench_policy)

    async def _report(self, measurement: RateMeasurement) -> bool:
        await self._enter("report")
        snapshot = self.monitors.last_memory or self.resources.sample()
        verdict = self._bound(measurement)
        result = bench_result(
            measurement, self._plan_now(), snapshot,
            rate_time_scale=self.config.rate_time_scale, memory_scale=self.config.plan_memory_scale,
            budget_left_s=self.reporter.bench_deadline() - time.monotonic(),
            step_downs=self.progress.step_downs, bound=verdict,
        )  # fmt: skip
        rate = result.rate
        log.info("bench.result", **result.figures)
        self.shipper.add_line("benchout", result.line, milestone=True)
        if verdict is not None:
            self.shipper.add_line("benchout", verdict.line(), milestone=True)
        self.metrics.bench_rate(rate, measurement.uncertainty)
        self.metrics.bench_bound(verdict)
        await self.state.update(lambda st: st.with_bench(result.record))
        if measurement.proofs == 0:
            reason = f"no benchmark proof completed ({self.last_failure})"
            raise LifecycleFailure(exitcodes.BENCH_FAILED, reason)
        done = await self.reporter.bench_done(rate)
        self.daemon.source = "cuzk"
        if done.passed is None and self.reporter.judged:
            # The manager rejected /bench-done (a 4xx other than 404/408/429): no verdict. Going
            # on would move the record to running with no rate, past the MIN_RATE gate.
            reason = "no bench verdict: the manager rejected /bench-done"
            raise LifecycleFailure(exitcodes.BENCH_FAILED, reason)
        if done.passed is False:
            reason = f"bench failed: rate {rate:.2f} proofs/hour is below min_rate"
            self.last_verdict_reason = reason
            log.warning("bench.failed", rate=rate, min_rate=self.reporter.min_rate, reason=reason)
            self.shipper.add_line("setup", reason, milestone=True)
            return False
        if self.reporter.judged:  # else a local run: bench.unjudged (the reporter), never passed
            log.info("bench.passed", rate=rate)
        return True

    def _bound(self, measurement: RateMeasurement) -> Verdict | None:
        """What bounded the rate, from the status sampled over the latest stretch's completions
        (None when sampling is off)."""
        if self.config.bench_status_sample_s <= 0:
            return None
        plan = self._plan_now()
        shape = Shape(
            partition_workers=measurement.workers,
            concurrency=measurement.concurrency,
            gpus=max(1, plan.gpu_count),
            workers_source="the plan (the rendered config)",
            max_workers=memory_fit(plan.limit, self.memory_policy),
        )
        # The partitions' times are the daemon's, as the reported rate is (rate_time_scale).
        rate = measurement.rate_per_hour / self.config.rate_time_scale
        return judge(self.progress.bench_samples, shape, window=self.progress.bench_window,
                     rate_per_hour=rate)  # fmt: skip

    async def _run_phase(self) -> int:
        await self._enter("run")
        await self.reporter.running()
        self.proofs.release_input()  # the run phase sends no proof of its own
        self.release_memory()  # the bench's leftovers, not held for the days of the run phase
        if self.config.exit_after_run:
            return exitcodes.OK
        async with self.daemon.workers_kept(), self.health.watching():
            return await self._keep_running()

    async def _keep_running(self) -> int:
        """Until the manager kills us, the daemon's keeper gives up, the health watch told the
        manager the machine is broken, or memory trouble (step down and go on)."""
        ended, broken = self.daemon.ended, self.health.verdict
        while True:
            trouble = asyncio.create_task(self.signals.trouble.wait())
            gone = asyncio.create_task(self.signals.gone.wait())
            waits: set[asyncio.Future[Any]] = {trouble, gone, ended, broken}
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when a signal cancels us: no wait is left pending
                trouble.cancel()
                gone.cancel()
            if gone in done:
                return exitcodes.INSTANCE_GONE
            if broken in done:
                self.last_verdict_reason = f"health {broken.result()}"
                return exitcodes.HEALTH_BROKEN
            if ended in done:
                outcome = ended.result()
                if outcome.exit_code == exitcodes.DAEMON_CRASH_LOOP:
                    await self.health.daemon_gave_up(outcome.reason)  # told: rate 0
                raise LifecycleFailure(outcome.exit_code, f"daemon: {outcome.reason}")
            await self._step_down(self.signals.trouble_cause)

    # --- in any phase -----------------------------------------------------------------------

    async def _step_down(self, cause: str) -> None:
        """Memory trouble: a smaller plan (or out of memory, exit 5), adopted, then carried out."""
        plan, fit = await self.stepdown.next_plan(self._plan_now(), cause)
        await self._adopt(plan)
        await self.stepdown.relaunch(plan, fit)

    async def _adopt(self, plan: WorkerPlan) -> None:
        self.plan = plan
        await self.state.update(lambda st: dataclasses.replace(st, plan=plan.to_dict()))
        log.info("plan.made", summary=plan.summary(), full_workers=plan.full_workers,
                 warmup_workers=plan.warmup_workers,
                 total_budget_gib=plan.total_budget_gib)  # fmt: skip

    async def _enter(self, phase: str) -> None:
        """Durable before visible: the state file first, then the log (and so the manager)."""
        await self.state.update(lambda st: dataclasses.replace(st, phase=phase))
        self.progress.phase = phase
        self.metrics.set_phase(phase)
        self.progress.phase_started = time.monotonic()
        logcontext.bind(phase=phase)
        log.info("phase.entered", phase=phase)
        for listener in self.phase_listeners:
            listener(phase)

    def _plan_now(self) -> WorkerPlan:
        assert self.plan is not None, "no plan yet"
        return self.plan

    def _workers(self) -> int:
        running = self.daemon.workers
        return running if running is not None else (self.plan.full_workers if self.plan else 0)


@dataclass(frozen=True)
class LifecycleSource:
    """``/readyz``'s ``HealthSource`` (:mod:`cuzk_supervisor.serve.probes`) over the lifecycle:
    read at request time, nothing copied."""

    lifecycle: Lifecycle

    @property
    def phase(self) -> str:
        return self.lifecycle.progress.phase

    @property
    def daemon_ready(self) -> bool:
        keeper = self.lifecycle.keeper
        return keeper is not None and keeper.is_ready

    @property
    def last_failure(self) -> str:
        return self.lifecycle.last_failure

    @property
    def health(self) -> dict[str, str] | None:
        """The run phase's latest health assessment (None before the first)."""
        assessment = getattr(self.lifecycle.health, "assessment", None)
        if assessment is None:
            return None
        return {"level": assessment.level.word, "reason": assessment.reason}
