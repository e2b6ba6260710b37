"""The phase machine: register, params, plan, warmup, restart, settle, bench, report, run.

The only module that knows the order of phases (DESIGN.md). Every transition is written to the
state file before anyone is told, logged, and shipped to the manager's log endpoint. Failures are
values with reasons: a benchmark that cannot complete reports rate 0 with the reason (never
silence, incident I2) and ends with a documented exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters import params
from cuzk_supervisor.adapters.gpu import GpuProbe, GpuSample
from cuzk_supervisor.adapters.logship import LogShipper
from cuzk_supervisor.adapters.manager import (
    InstanceGone,
    ManagerClient,
    ManagerError,
    ManagerRejected,
    ManagerUnavailable,
    Outbox,
)
from cuzk_supervisor.adapters.proofinput import build_submit_request, load_c1
from cuzk_supervisor.adapters.proving import ProvingClient
from cuzk_supervisor.adapters.provingresults import ProofResult
from cuzk_supervisor.adapters.resources import MemorySampler
from cuzk_supervisor.adapters.state import StateKeeper, StateWriteError
from cuzk_supervisor.adapters.statedoc import BenchRecord, Report, SupervisorState, utc_now_iso
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.cli import observe
from cuzk_supervisor.core.bench import (
    BenchPolicy,
    RateMeasurement,
    Stretch,
    choose_measurement,
    interval_estimate_s,
    measurement_fits,
    split_at_stalls,
    steady_rate_per_s,
)
from cuzk_supervisor.core.exits import DaemonExit, ExitKind
from cuzk_supervisor.core.memfit import MemoryFit, fit_workers
from cuzk_supervisor.core.memory import PlanInputs
from cuzk_supervisor.core.plan import (
    GiveUpOOM,
    PlanRefusal,
    WorkerPlan,
    plan_workers,
    step_down,
    total_budget_gib,
)
from cuzk_supervisor.core.reconcile import gone_reason, manager_time
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_GONE, OUTCOME_OK, PARAM_DONE, RUNNING
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.core.units import GIB
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.keeper import DaemonKeeper, KeeperOutcome
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.daemon.process import DaemonProcess
from cuzk_supervisor.daemon.status import active_partitions
from cuzk_supervisor.daemon.workers import CommandProcess
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.lifecycle import assemble
from cuzk_supervisor.lifecycle.benchrun import StretchRun
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.runtime import Runtime
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings import Settings

log = structlog.get_logger()
T = TypeVar("T")

# How often a failed proof (daemon FAILED result, lost job, budget) is tried before giving up.
PROOF_ATTEMPTS = 3


class LifecycleFailure(Exception):
    """The lifecycle cannot go on: ``reason`` goes to the manager, ``exit_code`` to the shell."""

    def __init__(self, exit_code: int, reason: str) -> None:
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


class _MemoryTrouble(Exception):
    """Critical memory or an OOM kill interrupted a proof: step down and try again."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class _DaemonRestarted(Exception):
    """The daemon exited under a proof (crash, liveness kill) and its keeper is restarting it:
    the jobs in flight are lost with it."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


# Verdicts that stand across a restart of the container (see SupervisorState.verdict).
TERMINAL_CODES = frozenset({exitcodes.BENCH_FAILED, exitcodes.INSTANCE_GONE,
                            exitcodes.OUT_OF_MEMORY})  # fmt: skip

# Phases in which the manager's record is looked up at every status interval (killed?).
WATCHED_PHASES = frozenset({"params", "plan", "warmup", "restart", "settle", "bench", "report",
                            "run"})  # fmt: skip


def resolve_label(settings: Settings, environ: Mapping[str, str]) -> str:
    label = settings.label or environ.get("VAST_CONTAINERLABEL", "").strip()
    if not label:
        raise UsageError(
            "no instance label: set --label (CUZK_SUPERVISOR_LABEL) or VAST_CONTAINERLABEL"
        )
    return label


def resolve_min_rate(settings: Settings, environ: Mapping[str, str]) -> float:
    if settings.min_rate:
        return settings.min_rate
    raw = environ.get("MIN_RATE", "").strip()
    if not raw:
        return 0.0  # the manager applies its default (50)
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"MIN_RATE={raw!r} is not a number of proofs per hour") from None
    if value < 0:
        raise UsageError(f"MIN_RATE={raw!r} must be >= 0")
    return value


@dataclass
class Progress:
    """What the status lines say: kept by the lifecycle, read by the status task."""

    phase: str = "start"
    phase_started: float = dataclasses.field(default_factory=time.monotonic)
    proofs_done: int = 0
    proofs_failed: int = 0
    step_downs: int = 0


class Lifecycle:
    def __init__(
        self,
        settings: Settings,
        runtime: Runtime,
        *,
        label: str,
        min_rate: float,
        manager: ManagerClient,
        state: StateKeeper,
        outbox: Outbox,
        shipper: LogShipper,
        sampler: MemorySampler,
        gpu: GpuProbe,
        risk_policy: RiskPolicy | None = None,
        metrics: SupervisorMetrics | None = None,
    ) -> None:
        self.s = settings
        self.rt = runtime
        self.label = label
        self.min_rate = min_rate
        self.manager = manager
        self.state = state
        self.outbox = outbox
        self.shipper = shipper
        self.sampler = sampler
        self.gpu = gpu
        self.progress = Progress()
        self.keeper: DaemonKeeper | None = None
        self._keeper_task: asyncio.Task[KeeperOutcome] | None = None
        self._memory_policy = assemble.memory_policy(settings)
        self.watch = MemoryWatch(sampler, risk_policy or RiskPolicy(), self._daemon_pid)
        self.metrics = metrics or SupervisorMetrics()
        self.watch.add_listener(lambda a: self.metrics.memory(a.headroom_bytes, a.level))
        self._trouble = asyncio.Event()
        self._acted = asyncio.Event()  # a step-down was carried out: watch for the next one
        self._gone = asyncio.Event()
        self._gone_reason = ""
        self._daemon_exited = asyncio.Event()  # set at every daemon exit; cleared by proof work
        self._exit_cause = ""
        self._outbox_kick = asyncio.Event()
        self._status_usable = True  # False once GET /status proved unusable (one warning)
        # Daemon output goes to the dashboard's benchdaemon tab until the bench is reported.
        self._daemon_source = "benchdaemon"
        self.bench_policy = BenchPolicy(
            max_proofs=settings.bench_count,
            concurrency=settings.bench_concurrency,
            safety=settings.bench_safety,
            min_proofs=settings.bench_min_proofs,
        )
        self.bench_planned = 0
        self.stretch: Stretch | None = None
        self._running_sent_at = float("inf")  # the first /running report, then pings follow
        self._trouble_cause = ""
        self.plan: WorkerPlan | None = None
        self.uuid: str | None = None
        self.reported = False
        self.last_failure = ""
        self._request: pb.SubmitProofRequest | None = None
        self.phase_listeners: list[Callable[[str], None]] = []
        self.gpu_sample: GpuSample | None = None
        self.last_verdict_reason = ""

    # --- plumbing -------------------------------------------------------------------------

    def _daemon_pid(self) -> int | None:
        current = self.keeper.current if self.keeper else None
        return current.pid if current is not None else None

    async def _enter(self, phase: str) -> None:
        """Durable before visible: the state file first, then the log (and so the manager)."""
        await self.state.update(lambda st: dataclasses.replace(st, phase=phase))
        self.progress.phase = phase
        self.metrics.set_phase(phase)
        self.progress.phase_started = time.monotonic()
        observe.bind(phase=phase)
        log.info("phase.entered", phase=phase)
        for listener in self.phase_listeners:
            listener(phase)

    def _values(self, workers: int) -> DaemonConfigValues:
        assert self.plan is not None
        return DaemonConfigValues(
            partition_workers=workers,
            total_budget_gib=total_budget_gib(workers, self.plan.limit, self._memory_policy),
            max_parallel_synthesis=workers,
            listen=assemble.daemon_listen(self.s),
            status_listen=self.s.daemon_status_listen,
            param_cache=str(self.s.daemon_param_cache),
            log_level=self.s.daemon_log_level,
        )

    def _on_daemon_exit(self, exit: DaemonExit) -> None:
        self.metrics.daemon_exit(exit.kind)
        self.last_failure = f"daemon {exit.kind.value}: {exit.reason}"
        self._exit_cause = f"daemon {exit.kind.value} ({exit.reason})"
        self._daemon_exited.set()
        if exit.kind is ExitKind.OOM_KILLED:
            self._flag_trouble(f"daemon OOM-killed ({exit.reason})")

    def _daemon_line(self, line: str) -> None:
        self.shipper.add_line(self._daemon_source, line)

    def _flag_trouble(self, cause: str) -> None:
        if not self._trouble.is_set():
            self._trouble_cause = cause
            self._trouble.set()

    async def _critical_memory(self) -> None:
        while True:
            await self.watch.critical.wait()
            assessment = self.watch.assessment
            reason = assessment.reason if assessment else "memory critical"
            if self.s.proactive_oom:
                self._flag_trouble(f"memory critical: {reason}")
                # Listen again once the lifecycle has stepped down and replaced the daemon.
                await self._acted.wait()
                self._acted.clear()
                continue
            log.warning("memory.critical_ignored", detail="proactive_oom is off", reason=reason)
            self.watch.critical.clear()

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> int:
        async with asyncio.TaskGroup() as group:
            shipper_task = group.create_task(self.shipper.run())
            status_task = group.create_task(self._status_loop())
            watch_task = group.create_task(self.watch.run())
            critical_task = group.create_task(self._critical_memory())
            gpu_task = group.create_task(self._gpu_loop())
            outbox_task = group.create_task(self._outbox_loop())
            try:
                return await self._run_guarded()
            finally:
                await self._stop_daemon()
                for task in (status_task, watch_task, critical_task, gpu_task, outbox_task):
                    task.cancel()
                self.shipper.stop()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(shipper_task), 10)

    async def _run_guarded(self) -> int:
        verdict = self.state.state.verdict
        if verdict is not None:
            return await self._stay_finished(verdict)
        code = await self._run_to_a_code()
        if code in TERMINAL_CODES:
            reason = self.last_verdict_reason or self.last_failure or f"exit {code}"
            record = {"exit_code": code, "reason": reason, "at": utc_now_iso()}
            with contextlib.suppress(StateWriteError):
                await self.state.update(lambda st: dataclasses.replace(st, verdict=record))
        return code

    async def _stay_finished(self, verdict: Mapping[str, Any]) -> int:
        """A terminal verdict stands: report it again, start nothing, stay up until stopped
        (so a restart policy does not turn it into a loop of registrations and benchmarks)."""
        reason = str(verdict.get("reason", ""))
        self.last_failure = f"finished: {reason}"
        if self.state.state.uuid:
            self.shipper.set_uuid(self.state.state.uuid)
        await self._enter("finished")
        log.warning("lifecycle.finished", exit_code=verdict.get("exit_code"), reason=reason,
                    detail="a terminal verdict from an earlier run; remove the state file "
                           "to start over")  # fmt: skip
        self.shipper.add_line("setup", f"finished earlier: {reason}")
        if self.s.exit_after_run:
            code = verdict.get("exit_code")
            return code if isinstance(code, int) else exitcodes.FAILURE
        await asyncio.Event().wait()  # until the signal cancels us
        return exitcodes.OK  # pragma: no cover - never reached

    async def _run_to_a_code(self) -> int:
        try:
            return await self._run_unless_gone()
        except LifecycleFailure as failure:
            self.last_verdict_reason = failure.reason
            await self._report_failure(failure.reason)
            return failure.exit_code
        except StateWriteError as exc:
            log.error("state.unwritable", reason=str(exc))
            await self._report_failure(f"state file unwritable: {exc}", durable=False)
            return exitcodes.STATE_UNWRITABLE
        except Exception as exc:
            # The top-level guard: a bug or an unforeseen OS error is still one event, a reason
            # told to the manager and a documented code, never a traceback on the way out.
            where = _innermost_frame(exc)
            reason = f"unexpected {type(exc).__name__}: {exc} ({where})"
            log.error("supervisor.crashed", reason=reason, phase=self.progress.phase)
            await self._report_failure(reason)
            return exitcodes.FAILURE

    async def _run_unless_gone(self) -> int:
        """The lifecycle, cut short when the manager killed this instance: nothing more is sent
        (a report would revive it), the daemon is stopped, the reason is pushed."""
        body = asyncio.ensure_future(self._run())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({body, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if body.done():
            try:
                return body.result()
            except InstanceGone as exc:
                return await self._end_gone(exc.message)
        body.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await body
        return await self._end_gone(self._gone_reason)

    async def _end_gone(self, reason: str) -> int:
        self.last_verdict_reason = f"instance gone: {reason}"
        log.warning("manager.instance_gone", reason=reason, phase=self.progress.phase)
        self.reported = True  # nothing may be reported for a killed instance
        self.shipper.add_line("setup", f"instance gone in {self.progress.phase}: {reason}")
        await self._stop_daemon()
        with contextlib.suppress(StateWriteError):
            await self.state.update(lambda st: st.with_failure(f"instance gone: {reason}"))
        return exitcodes.INSTANCE_GONE

    def _mark_gone(self, reason: str) -> None:
        if not self._gone.is_set():
            self._gone_reason = reason
            self._gone.set()

    async def _run(self) -> int:
        drained = await self.outbox.drain(deadline_s=10)
        if drained.sent:
            log.info("manager.outbox_resent", reports=len(drained.sent))
        await self._register()
        await self._params()
        verdict = self.outbox.latest(BENCH_DONE)
        if verdict is not None and verdict.passed is not None:
            # A finished and answered benchmark is not rerun after a restart.
            log.info("bench.already_reported", rate=verdict.rate, passed=verdict.passed)
            self.metrics.bench_rate(verdict.rate or 0.0)
            self._daemon_source = "cuzk"
            if not verdict.passed:
                return exitcodes.BENCH_FAILED
            self.reported = True
            await self._plan()
            await self._start_daemon(self.plan.full_workers)  # type: ignore[union-attr]
            return await self._run_phase()
        await self._plan()
        measurement = await self._benchmark()
        passed = await self._report(measurement)
        if not passed:
            return exitcodes.BENCH_FAILED
        return await self._run_phase()

    # --- phases ---------------------------------------------------------------------------

    async def _register(self) -> None:
        await self._enter("register")
        while True:
            try:
                registration = await self.manager.register(self.label, self.min_rate)
                break
            except ManagerUnavailable as exc:
                log.warning("manager.register_waiting", url=self.manager.base_url, reason=str(exc))
        previous = self.state.state
        if previous.uuid and previous.uuid != registration.uuid:
            # The manager killed our old instance and gave a new one: nothing of it carries on
            # except the parameters on disk.
            log.warning("manager.new_instance", old_uuid=previous.uuid, uuid=registration.uuid)
            await self.state.update(
                lambda st: SupervisorState(params_verified=st.params_verified, phase=st.phase)
            )
            self.outbox = Outbox.for_keeper(self.manager, self.state)
        self.uuid = registration.uuid
        await self.state.update(
            lambda st: dataclasses.replace(
                st, uuid=registration.uuid, runner_id=registration.runner_id, label=self.label
            )
        )
        self.shipper.set_uuid(registration.uuid)
        observe.bind(uuid=registration.uuid)

    async def _params(self) -> None:
        await self._enter("params")
        expected = params.parse_expected(self.s.params_expected)
        already = self.state.state.params_verified
        if already and not expected:
            log.info("params.already_verified")
        else:
            pump = OutputPump("setup", None)
            pump.add_listener(self.shipper.listener("setup"))
            try:
                await params.ensure_params(
                    self.s.daemon_param_cache,
                    expected,
                    "" if already else self.s.params_fetch_command,
                    timeout_s=self.s.params_timeout_s,
                    progress_interval_s=self.s.params_progress_interval_s,
                    spawn=self.rt.reaper.spawn,
                    pump=pump,
                    pidfile=self.s.state_dir / "fetch.pid",
                    on_progress=lambda p: print(p.line(), flush=True) if _tty() else None,
                )
            except params.ParamsFailed as exc:
                raise LifecycleFailure(exitcodes.PARAMS_FAILED, f"params: {exc}") from None
        if not already:
            await self.state.update(
                lambda st: dataclasses.replace(st, params_verified=True, params_done_at=time.time())
            )
        acked = self.outbox.latest(PARAM_DONE)
        if acked is not None and acked.outcome == OUTCOME_OK:
            await self._start_bench_clock(resumed=True)
        if acked is None:
            # Queued, durable, and sent by the outbox task: the warmup does not wait on the
            # manager (its clock starts when it acknowledges, see _bench_deadline).
            await self.outbox.enqueue(Report(kind=PARAM_DONE, uuid=self._uuid()))
        self._outbox_kick.set()

    async def _plan(self) -> None:
        await self._enter("plan")
        snapshot = self.sampler.sample()
        devices = []
        if self.gpu.available:
            devices = await asyncio.to_thread(self.gpu.devices)
        inputs = PlanInputs(
            host_total_bytes=snapshot.host_total,
            cgroup_limit_bytes=snapshot.cgroup_limit,
            gpu_vram_total_bytes=tuple(d.total_bytes for d in devices),
            workers_override=self.s.workers or None,
            memory_scale=self.s.plan_memory_scale,
        )
        result = plan_workers(inputs, self._memory_policy)
        if isinstance(result, PlanRefusal):
            raise LifecycleFailure(exitcodes.OUT_OF_MEMORY, f"plan refused: {result.reason}")
        await self._adopt(result)

    async def _adopt(self, plan: WorkerPlan) -> None:
        self.plan = plan
        await self.state.update(lambda st: dataclasses.replace(st, plan=plan.to_dict()))
        log.info(
            "plan.made",
            summary=plan.summary(),
            full_workers=plan.full_workers,
            warmup_workers=plan.warmup_workers,
            total_budget_gib=plan.total_budget_gib,
        )

    async def _benchmark(self) -> RateMeasurement:
        """Warmup, restart, then settle and bench until a measurement stands."""
        while True:
            try:
                await self._warmup()
                break
            except _MemoryTrouble as trouble:
                await self._step_down(trouble.cause)
        assert self.plan is not None
        if self.s.restart_after_warmup and self.plan.full_workers != self.plan.warmup_workers:
            await self._enter("restart")
            await self._restart_daemon(self.plan.full_workers)
        return await self._measure()

    async def _warmup(self) -> None:
        assert self.plan is not None
        plan = self.plan
        await self._enter("warmup")
        await self._start_daemon(plan.warmup_workers)
        warm = await self._prove(self.s.warmup_budget_s)
        await self.state.update(lambda st: dataclasses.replace(st, pce_ready=True))
        log.info("warmup.done", wall_s=round(warm.wall_s, 3), workers=plan.warmup_workers)

    async def _measure(self) -> RateMeasurement:
        """Settle, then one stretch of proofs sized to the budget as it runs (core.bench).

        A daemon restart or a step-down inside the bench ends the stretch: the proofs in flight
        are lost time, not throughput. The daemon is settled again at the current plan and a new
        stretch measures anew, while the budget allows one; the rate comes from
        :func:`~cuzk_supervisor.core.bench.choose_measurement`.
        """
        stretches: list[Stretch] = []
        settle_s = 0.0
        while True:
            try:
                await self._enter("settle")
                settle = await self._prove(self.s.proof_budget_s)
                settle_s = settle.wall_s
                log.info("settle.done", wall_s=round(settle_s, 3), workers=self._workers())
                await self._enter("bench")
                stretches.append(await self._stretch())
            except _MemoryTrouble as trouble:
                if self.stretch is not None and self.progress.phase == "bench":
                    stretches.append(self.stretch.interrupt(f"step-down: {trouble.cause}"))
                self.stretch = None
                await self._step_down(trouble.cause)
            if stretches and not stretches[-1].interrupted:
                break
            if not self._room_to_measure(stretches, settle_s):
                log.warning("bench.no_time_to_measure_again", stretches=len(stretches))
                break
        pieces = [piece for stretch in stretches for piece in split_at_stalls(stretch)]
        return choose_measurement(pieces, self.bench_policy)

    def _room_to_measure(self, stretches: list[Stretch], settle_s: float) -> bool:
        intervals = [interval_estimate_s(s) for s in reversed(stretches)]
        interval = next((i for i in intervals if i is not None), None)
        if interval is None:
            interval = max(settle_s, 1e-3)  # nothing measured yet: as slow as a first use
        left = self._bench_deadline() - time.monotonic()
        return measurement_fits(left, settle_s, interval, self.bench_policy)

    async def _stretch(self) -> Stretch:
        """One stretch; a daemon restart under it ends it as interrupted (its completions kept)."""
        run = StretchRun(self.bench_policy, self._workers(), self._bench_deadline,
                         daemon_seconds_per_second=self.s.rate_time_scale)  # fmt: skip
        self.stretch = run.stretch
        self.bench_planned = self.bench_policy.max_proofs
        benchout = self.shipper.listener("benchout")
        log.info(
            "bench.started",
            concurrency=run.stretch.concurrency,
            max_proofs=self.bench_policy.max_proofs,
            budget_left_s=round(self._bench_deadline() - time.monotonic(), 1),
        )

        def on_result(index: int, result: ProofResult, stretch: Stretch) -> None:
            self.stretch = stretch
            self.metrics.proof_finished(result.ok, result.wall_s)
            if result.ok:
                self.progress.proofs_done += 1
            else:
                self.progress.proofs_failed += 1
            benchout(
                f"proof {index + 1} of up to {self.bench_policy.max_proofs} {result.status} "
                f"{result.wall_s:.2f}s {result.error}".rstrip()
            )

        request = self._c1_request()
        try:
            stretch = await self._watched(
                lambda client: run.run(client, request, self.s.proof_budget_s, on_result)
            )
        except _DaemonRestarted as restart:
            stretch = run.stretch.interrupt(restart.cause)
            log.warning("bench.interrupted", cause=restart.cause,
                        completed=len(stretch.completions), lost=stretch.in_flight)  # fmt: skip
            benchout(f"bench interrupted: {restart.cause}; {stretch.in_flight} proof(s) lost")
            await self._daemon_ready()
        except _MemoryTrouble:
            self.stretch = run.stretch
            raise
        self.stretch = None
        log.info("bench.stretch_done", submitted=stretch.submitted,
                 completed=len(stretch.completions), stopped=run.stop_reason)  # fmt: skip
        return stretch

    def _workers(self) -> int:
        if self.keeper is not None:
            return self.keeper.values.partition_workers
        return self.plan.full_workers if self.plan else 0

    def _bench_deadline(self) -> float:
        """The end of the manager's benchmark budget, on the monotonic clock.

        One clock, the manager's: it counts from its acknowledgement of /param-done (or its own
        ``param_done_at``), kept in the state file. Until it acknowledged, its clock has not
        started, so the whole budget is still ahead (asked again at every decision).
        """
        start = self.state.state.bench_clock_start
        if start is None:
            return time.monotonic() + self.s.bench_budget_s
        return time.monotonic() + (start + self.s.bench_budget_s - time.time())

    async def _report(self, measurement: RateMeasurement) -> bool:
        await self._enter("report")
        assert self.plan is not None
        plan = self.plan
        rate = measurement.rate_per_hour / self.s.rate_time_scale
        completed = measurement.proofs
        wall_s = measurement.interval_s
        snapshot = self.watch.last or self.sampler.sample()
        how = {
            **measurement.to_dict(),
            "rate": round(rate, 3),
            "budget_left_s": round(self._bench_deadline() - time.monotonic(), 1),
            "step_downs": self.progress.step_downs,
        }
        figures = {
            "rate": round(rate, 3),
            "completed": completed,
            "wall_s": round(wall_s, 3),
            "workers": plan.full_workers,
            "gpus": plan.gpu_count,
            "vram_gib": [round(v / GIB, 1) for v in plan.gpu_vram_total_bytes],
            "ram_gib": round(snapshot.host_total / GIB, 1),
            "cgroup_limit_gib": round(snapshot.cgroup_limit / GIB, 1)
            if snapshot.cgroup_limit
            else None,
            "measurement": how,
        }
        log.info("bench.result", **figures)
        self.shipper.add_line(
            "benchout",
            f"bench result: {rate:.2f} proofs/hour from {completed} proofs over "
            f"{wall_s:.1f}s at concurrency {measurement.concurrency}, {measurement.workers} "
            f"workers; {measurement.reason}; budget left {how['budget_left_s']}s",
        )
        self.metrics.bench_rate(rate)
        record = BenchRecord(
            rate=rate, completed=completed, wall_s=wall_s, plan=plan.to_dict(), measurement=how
        )
        await self.state.update(lambda st: st.with_bench(record))
        if completed == 0:
            raise LifecycleFailure(
                exitcodes.BENCH_FAILED, f"no benchmark proof completed ({self.last_failure})"
            )
        await self._check_alive()
        report = self._pending_bench() or Report(kind=BENCH_DONE, uuid=self._uuid(), rate=rate)
        done = await self._send(report)
        self.reported = True
        self._daemon_source = "cuzk"
        if done.passed is False:
            reason = f"bench failed: rate {rate:.2f} proofs/hour is below min_rate"
            self.last_verdict_reason = reason
            log.warning("bench.failed", rate=rate, min_rate=self.min_rate, reason=reason)
            self.shipper.add_line("setup", reason)
            return False
        log.info("bench.passed", rate=rate)
        return True

    async def _run_phase(self) -> int:
        await self._enter("run")
        await self._send(Report(kind=RUNNING, uuid=self._uuid()))
        self._running_sent_at = time.monotonic()
        if self.s.exit_after_run:
            return exitcodes.OK
        keepers = [self._worker_keeper(i, cmd) for i, cmd in enumerate(self.s.worker_commands)]
        # Plain tasks, not a TaskGroup: a verdict raised while they run (out of memory at one
        # worker, a crash loop) must reach _run_guarded as itself, not wrapped in a group.
        tasks = [asyncio.create_task(self._keep_worker(keeper)) for keeper in keepers]
        try:
            return await self._keep_running()
        finally:
            for keeper in keepers:
                await keeper.stop()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, self.s.daemon_stop_grace_s + 5)

    def _worker_keeper(self, index: int, command: str) -> DaemonKeeper:
        source = "curio" if index == 0 else f"worker{index}"

        def factory(*_: object) -> CommandProcess:
            return CommandProcess(
                command,
                source=source,
                stop_grace_s=self.s.daemon_stop_grace_s,
                spawn=self.rt.reaper.spawn,
                line_listener=self.shipper.listener(source),
                pid_dir=self.s.state_dir,
            )

        assert self.keeper is not None
        return DaemonKeeper(
            self.keeper.settings, self.keeper.values, assemble.restart_policy(self.s),
            process_factory=factory, name=source,
        )  # fmt: skip

    async def _keep_worker(self, keeper: DaemonKeeper) -> None:
        """A worker that crash-loops is given up on (logged and shipped); proving goes on."""
        outcome = await keeper.run()
        if outcome.exit_code:
            self.shipper.add_line("setup", f"{keeper.name} stopped: {outcome.reason}")

    async def _keep_running(self) -> int:
        assert self._keeper_task is not None
        while True:
            trouble = asyncio.create_task(self._trouble.wait())
            gone = asyncio.create_task(self._gone.wait())
            done, _ = await asyncio.wait(
                {trouble, gone, self._keeper_task}, return_when=asyncio.FIRST_COMPLETED
            )
            trouble.cancel()
            gone.cancel()
            if gone in done:
                return exitcodes.INSTANCE_GONE
            if self._keeper_task in done:
                outcome = self._keeper_task.result()
                raise LifecycleFailure(outcome.exit_code, f"daemon: {outcome.reason}")
            await self._step_down(self._trouble_cause)

    # --- the daemon and proofs ------------------------------------------------------------

    async def _start_daemon(self, workers: int) -> None:
        if self.keeper is None:
            factory = functools.partial(
                DaemonProcess,
                spawn=self.rt.reaper.spawn,
                memory_at_limit=self.watch.at_limit,
                line_listeners=(self._daemon_line,),
            )
            self.keeper = DaemonKeeper(
                assemble.daemon_settings(
                    self.s, self.sampler.cgroup.dir if self.sampler.cgroup else None
                ),
                self._values(workers),
                assemble.restart_policy(self.s),
                process_factory=factory,
            )
            self.keeper.add_exit_listener(self._on_daemon_exit)
            self._keeper_task = asyncio.create_task(self.keeper.run())
        elif self.keeper.values.partition_workers != workers:
            self.keeper.restart_with(self._values(workers))
        await self._daemon_ready()

    async def _restart_daemon(self, workers: int) -> None:
        assert self.keeper is not None
        self.keeper.restart_with(self._values(workers))
        await self._daemon_ready()

    async def _daemon_ready(self) -> None:
        assert self.keeper is not None
        assert self._keeper_task is not None
        ready = asyncio.create_task(self.keeper.wait_ready())
        done, _ = await asyncio.wait(
            {ready, self._keeper_task}, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            outcome = self._keeper_task.result()
            code = outcome.exit_code
            raise LifecycleFailure(code, f"daemon: {outcome.reason}")
        self.watch.mark_base()  # ready and idle: the base a memory fit is measured over

    async def _stop_daemon(self) -> None:
        if self.keeper is not None and self._keeper_task is not None:
            await self.keeper.stop()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._keeper_task)

    def _c1_request(self) -> pb.SubmitProofRequest:
        if self._request is None:
            try:
                self._request = build_submit_request(load_c1(self.s.c1_file))
            except UsageError as exc:
                raise LifecycleFailure(exitcodes.USAGE, str(exc)) from None
        return self._request

    async def _watched(self, work: Callable[[ProvingClient], Awaitable[T]]) -> T:
        """Run proof work; critical memory, an OOM kill, a daemon exit or a dead keeper
        interrupt it (the jobs of an exited daemon are lost: waiting for them is waste)."""
        assert self._keeper_task is not None
        keeper_task = self._keeper_task
        self._daemon_exited.clear()
        address = parse_address(assemble.daemon_listen(self.s))
        timeouts = assemble.proving_timeouts(self.s)
        reconnected = self.metrics.grpc_reconnect
        async with ProvingClient(address, timeouts, on_reconnect=reconnected) as client:
            job = asyncio.ensure_future(work(client))
            trouble = asyncio.ensure_future(self._trouble.wait())
            exited = asyncio.ensure_future(self._daemon_exited.wait())
            try:
                done, _ = await asyncio.wait(
                    {job, trouble, exited, keeper_task}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                trouble.cancel()
                exited.cancel()
            if job in done:
                return job.result()
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
            if keeper_task.done():
                outcome = keeper_task.result()
                raise LifecycleFailure(outcome.exit_code, f"daemon: {outcome.reason}")
            if self._trouble.is_set():
                raise _MemoryTrouble(self._trouble_cause)
            raise _DaemonRestarted(self._exit_cause or "daemon exited")

    async def _prove(self, budget_s: float) -> ProofResult:
        """One proof, tried up to PROOF_ATTEMPTS times; memory trouble propagates."""
        last = None
        attempt = 0
        while attempt < PROOF_ATTEMPTS:
            attempt += 1
            try:
                result = await self._watched(
                    lambda client: client.prove(self._c1_request(), budget_s)
                )
            except _DaemonRestarted as restart:
                # Not the proof's failure: submit it again the moment the new daemon answers
                # (a crash loop ends in the keeper's verdict, which _watched raises).
                log.warning("proof.daemon_restarted", phase=self.progress.phase,
                            cause=restart.cause)  # fmt: skip
                attempt -= 1
                await self._daemon_ready()
                continue
            self.metrics.proof_finished(result.ok, result.wall_s)
            if result.ok:
                self.progress.proofs_done += 1
                return result
            self.progress.proofs_failed += 1
            last = result
            self.last_failure = f"{self.progress.phase} proof {result.status}: {result.error}"
            log.warning(
                "proof.attempt_failed",
                attempt=attempt,
                of=PROOF_ATTEMPTS,
                status=str(result.status),
                reason=result.error,
            )
        assert last is not None
        raise LifecycleFailure(
            exitcodes.BENCH_FAILED,
            f"{self.progress.phase} proof failed {PROOF_ATTEMPTS} times; last: {last.error}",
        )

    async def _step_down(self, cause: str) -> None:
        assert self.plan is not None
        running = self.keeper.values.partition_workers if self.keeper is not None else None
        fit = await self._measured_fit(running)
        result = step_down(
            self.plan, cause, self._memory_policy, running_workers=running,
            fitted=fit.workers if fit else None, fitted_reason=fit.reason if fit else "",
        )  # fmt: skip
        if isinstance(result, GiveUpOOM):
            raise LifecycleFailure(exitcodes.OUT_OF_MEMORY, f"out of memory: {result.reason}")
        self.progress.step_downs += 1
        log.warning(
            "plan.step_down",
            cause=cause,
            full_workers=result.full_workers,
            warmup_workers=result.warmup_workers,
        )
        await self._adopt(result)
        if self.keeper is not None:
            # A new plan is a new configuration: its failures are counted afresh (the OOM kills
            # that led here belong to the step-down policy, not to the crash-loop verdict).
            self.keeper.forget_failures()
            # Replace the daemon now, in any phase: it still holds the abandoned proof's memory
            # (or the keeper is restarting it with the old plan after an OOM kill). Only then
            # start the watch over, so no sample of the old daemon counts against the new plan.
            # In the warmup the warmup plan is retried; from the restart on, the full plan
            # (the PCE is built: a step-down in the bench settles and measures at once).
            warm = self.progress.phase in ("plan", "warmup")
            workers = result.warmup_workers if warm else result.full_workers
            self.keeper.restart_with(self._values(workers))
            await self._daemon_ready()
        self._trouble.clear()
        self.watch.acknowledge()
        # The new plan's plateau, as measured: a ramp toward it is not a march to OOM.
        self.watch.plateau_bytes = (
            round(fit.base + result.full_workers * fit.per_partition) if fit else None
        )
        self._acted.set()

    async def _measured_fit(self, running: int | None) -> MemoryFit | None:
        """What fits, from the memory the running plan was measured to use (None: one step)."""
        assessment, base = self.watch.assessment, self.watch.base_bytes
        if assessment is None or base is None or running is None:
            return None
        active = await asyncio.to_thread(active_partitions, self.s.daemon_status_listen)
        if not active:
            return None
        fit = fit_workers(
            limit=assessment.limit_bytes, base=base, used=assessment.used_bytes,
            active_partitions=active, running_workers=running,
            # Where the watch reads ok again: a plan that fits keeps the level there.
            target_headroom=self.watch.policy.warn_exit_headroom,
        )  # fmt: skip
        if fit is not None:
            log.info("memory.fit", workers=fit.workers, reason=fit.reason,
                     plateau_bytes=fit.plateau)  # fmt: skip
        return fit

    # --- manager --------------------------------------------------------------------------

    def _uuid(self) -> str:
        assert self.uuid is not None
        return self.uuid

    def _pending_bench(self) -> Report | None:
        report = self.outbox.latest(BENCH_DONE)
        return report if report is not None and report.outcome is None else None

    async def _send(self, report: Report) -> Report:
        """Send a report until the manager answers; InstanceGone ends the instance."""
        while True:
            try:
                return await self.outbox.send_now(report)
            except ManagerUnavailable as exc:
                log.warning("manager.report_waiting", kind=report.kind, reason=str(exc))
            except InstanceGone:
                raise
            except ManagerError as exc:
                log.error("manager.report_rejected", kind=report.kind, reason=str(exc))
                return report

    async def _report_failure(self, reason: str, *, durable: bool = True) -> None:
        """No silence: the reason to the log endpoint, and rate 0 if no rate was reported."""
        log.error("lifecycle.failed", reason=reason, phase=self.progress.phase)
        self.shipper.add_line("setup", f"FAILED in {self.progress.phase}: {reason}")
        if durable:
            with contextlib.suppress(StateWriteError):
                await self.state.update(lambda st: st.with_failure(reason))
        if self.uuid is None or self.reported:
            return
        report = self._pending_bench() or Report(kind=BENCH_DONE, uuid=self.uuid, rate=0.0)
        try:
            if durable:
                await self.outbox.send_now(report, deadline_s=60)
            else:
                await self.manager.bench_done(self.uuid, 0.0, stop_s=60)
            self.reported = True
        except (ManagerError, StateWriteError) as exc:
            log.error("manager.failure_unreported", reason=str(exc))

    # --- the outbox and the manager's view of us ----------------------------------------------

    async def _outbox_loop(self) -> None:
        """Send what the outbox holds, in order, whenever it holds something, so that progress
        never waits on the manager; while it is away, try again with a growing pause."""
        pause = 1.0
        while True:
            await self._outbox_kick.wait()
            self._outbox_kick.clear()
            while self.outbox.pending and not self._gone.is_set():
                try:
                    result = await self.outbox.drain(deadline_s=self.s.manager_retry_s)
                except StateWriteError as exc:
                    log.error("manager.outbox_unsaved", reason=str(exc))
                    result = None
                if result is not None:
                    await self._after_drain(result.sent)
                    if result.error is None and result.sent:
                        pause = 1.0
                        continue
                # The manager is away (back off), or the head is still being written by its
                # sender, who sends it itself: wait, never spin (an uncontended lock and an
                # empty drain do not yield to the event loop).
                away = result is None or result.error is not None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._outbox_kick.wait(), pause if away else 1.0)
                self._outbox_kick.clear()
                if away:
                    pause = min(pause * 2, 30.0)

    async def _after_drain(self, sent: tuple[Report, ...]) -> None:
        for report in sent:
            if report.outcome == OUTCOME_GONE:
                self._mark_gone(report.detail or f"{report.kind} answered 404")
            elif report.kind == PARAM_DONE and report.outcome == OUTCOME_OK:
                await self._start_bench_clock()

    async def _start_bench_clock(self, *, resumed: bool = False) -> None:
        """The manager acknowledged /param-done: its 45-minute clock runs from then, or from its
        own ``param_done_at`` when the record shows an earlier one (kept in the state file).
        ``resumed``: acknowledged before this process, by a build that kept no clock; the local
        params-done time is the safe (earlier) guess."""
        if self.state.state.bench_clock_start is not None:
            return
        start, source = time.time(), "acknowledged"
        done_at = self.state.state.params_done_at
        if resumed and done_at is not None:
            start, source = done_at, "params done (resumed)"
        looked_up, record = await self._record(stop_s=min(10.0, self.s.manager_retry_s))
        stamped = manager_time(record.get("param_done_at")) if looked_up and record else None
        if stamped is not None and stamped < start:
            start, source = stamped, "manager param_done_at"
        await self.state.update(lambda st: dataclasses.replace(st, bench_clock_start=start))
        log.info("bench.clock_started", source=source, ago_s=round(time.time() - start, 1),
                 budget_s=self.s.bench_budget_s)  # fmt: skip

    async def _record(self, *, stop_s: float) -> tuple[bool, Mapping[str, Any] | None]:
        """(looked up, this instance's record in GET /status or None when it is not listed);
        not looked up: no manager, the manager away, or no usable /status (one warning)."""
        if self.manager.is_local or self.uuid is None or not self._status_usable:
            return False, None
        try:
            return True, await self.manager.instance_record(self.uuid, stop_s=stop_s)
        except ManagerUnavailable:
            return False, None
        except ManagerRejected as exc:
            self._status_usable = False
            detail = "kills are no longer looked up; reports go on as before"
            log.warning("manager.status_unusable", reason=str(exc), detail=detail)
            return False, None

    async def _look_up_kill(self, *, stop_s: float) -> str | None:
        """The reason the manager's record says we are gone, or None (alive, or not known)."""
        looked_up, record = await self._record(stop_s=stop_s)
        return gone_reason(record) if looked_up else None

    async def _check_alive(self) -> None:
        """Before a report that would revive a killed instance: is it still alive?"""
        reason = await self._look_up_kill(stop_s=min(30.0, self.s.manager_retry_s))
        if reason is not None:
            self._mark_gone(reason)
            raise InstanceGone("status", self._uuid(), reason)

    # --- GPUs ------------------------------------------------------------------------------

    async def _gpu_loop(self) -> None:
        """Sample GPU memory; a device error mid-run is a GPU fault event naming the device."""
        seen: set[tuple[int, str]] = set()
        while True:
            await asyncio.sleep(self.s.status_interval_s)
            if not self.gpu.available:
                continue
            # NVML can stall on a GPU in a bad state: never in the event loop.
            sample = await asyncio.to_thread(self.gpu.sample)
            self.gpu_sample = sample
            self.metrics.gpus(sample.devices)
            for fault in sample.faults:
                if (fault.index, fault.error) in seen:
                    continue
                seen.add((fault.index, fault.error))
                log.error("gpu.fault", gpu=fault.index, error=fault.error)

    # --- status lines ---------------------------------------------------------------------

    def status_fields(self) -> dict[str, Any]:
        snapshot = self.watch.last
        fields: dict[str, Any] = {
            "phase": self.progress.phase,
            "elapsed_s": round(time.monotonic() - self.progress.phase_started, 1),
            "proofs_done": self.progress.proofs_done,
            "proofs_failed": self.progress.proofs_failed,
            "headroom_gib": round(snapshot.headroom / GIB, 2) if snapshot else None,
            "risk": self.watch.level.value,
            "restarts": max(0, (self.keeper.starts - 1) if self.keeper else 0),
            "step_downs": self.progress.step_downs,
        }
        stretch = self.stretch
        if self.progress.phase == "bench" and stretch is not None:
            rate = steady_rate_per_s(stretch.completions)
            interval = interval_estimate_s(stretch)
            left = max(0, self.bench_planned - len(stretch.completions))
            fields.update(
                bench_done=len(stretch.completions),
                bench_planned=self.bench_planned,
                rate_so_far=round(rate * 3600 / self.s.rate_time_scale, 2) if rate else None,
                eta_s=round(left * interval, 1) if interval is not None else None,
            )
        fields["text"] = status_text(fields)
        return fields

    async def _status_loop(self) -> None:
        """A status line at a steady cadence, so a slow but healthy machine visibly is one; the
        manager's record looked up (were we killed?); in the run phase a repeated (idempotent)
        /running as the liveness ping, at its own, slower cadence."""
        interval = self.s.status_interval_s
        while True:
            await asyncio.sleep(interval)
            log.info("status", **self.status_fields())
            if self.progress.phase in WATCHED_PHASES:
                reason = await self._look_up_kill(stop_s=max(1.0, interval))
                if reason is not None:
                    self._mark_gone(reason)
                    return
            since_report = time.monotonic() - self._running_sent_at
            ping_due = since_report >= self.s.running_ping_interval_s
            if self.progress.phase == "run" and self.uuid and ping_due:
                self._running_sent_at = time.monotonic()
                try:
                    await self.manager.running(self.uuid, stop_s=interval)
                except InstanceGone as exc:
                    self._mark_gone(f"/running answered: {exc.message}")
                    return
                except ManagerError as exc:
                    log.warning("manager.ping_failed", reason=str(exc))


def status_text(fields: Mapping[str, Any]) -> str:
    """The status line in words, for a person on the dashboard."""
    parts = [f"{fields['phase']} for {fields['elapsed_s']:.0f}s"]
    if "bench_done" in fields:
        parts.append(f"{fields['bench_done']} of up to {fields['bench_planned']} proofs")
        if fields.get("rate_so_far") is not None:
            parts.append(f"{fields['rate_so_far']:.1f} proofs/h so far")
        if fields.get("eta_s") is not None:
            parts.append(f"about {fields['eta_s']:.0f}s to go")
    else:
        parts.append(f"{fields['proofs_done']} proofs done")
    if fields.get("headroom_gib") is not None:
        parts.append(f"{fields['headroom_gib']:.1f} GiB memory headroom ({fields['risk']})")
    if fields.get("step_downs"):
        parts.append(f"{fields['step_downs']} step-down(s)")
    return ", ".join(parts)


def _innermost_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "no traceback"
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


def _tty() -> bool:
    return sys.stderr.isatty()
