"""Manager reporting: register, the reports (through the durable outbox), the failure report, the
outbox task and the manager's bench clock; the look-up of a kill from the dashboard and the
``/running`` ping are its base's (``killlookup.KillLookup``).

Durable before visible: every report is queued in the state file before it is sent. A report
that would revive a killed instance is never sent (the manager's record is looked up first);
once the manager said this instance is gone, ``signals.gone`` is set and nothing more goes out.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

import structlog
from tenacity import RetryCallState, retry_if_exception_type

from cuzk_supervisor import logcontext
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import (
    InstanceGone,
    ManagerError,
    ManagerUnavailable,
    Registration,
)
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState, utc_now_iso
from cuzk_supervisor.adapters.state.store import StateKeeper, StateWriteError
from cuzk_supervisor.core.benchclock import bench_deadline, prompt_ack
from cuzk_supervisor.core.jitter import first_delay, next_delay
from cuzk_supervisor.core.reconcile import manager_time
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_GONE, OUTCOME_OK, PARAM_DONE, RUNNING
from cuzk_supervisor.deadline import within
from cuzk_supervisor.lifecycle.killlookup import KillLookup
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.values import ReporterSettings

log = structlog.get_logger()


@dataclass(eq=False)
class Reporter(KillLookup):
    config: ReporterSettings
    _: KW_ONLY
    label: str
    min_rate: float
    manager: ManagerClient
    state: StateKeeper
    outbox: Outbox
    shipper: LogShipper
    signals: Signals
    progress: Progress
    retries: LifecycleRetries
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    uuid: str | None = field(default=None, init=False)
    reported: bool = field(default=False, init=False)
    """A verdict was reported (or must not be: a killed instance); no failure report."""
    _next_ping_at: float = field(default=float("inf"), init=False)  # pings follow /running
    _next_lookup_at: float | None = field(default=None, init=False)  # the periodic table read

    @property
    def judged(self) -> bool:
        """False in a local run (no manager URL): nobody judges the rate, nor passes it."""
        return not self.manager.is_local

    # --- register -----------------------------------------------------------------------------

    async def resend(self) -> None:
        """What a previous run left queued goes first (briefly: the manager may be away)."""
        drained = await self.outbox.drain(deadline_s=10)
        if drained.sent:
            log.info("manager.outbox_resent", reports=len(drained.sent))

    async def register(self) -> None:
        """``/register`` until it answers; a new uuid for our label means the old instance was
        killed: nothing of it carries on but the params."""
        retrying = self.retries.register.controller(
            retry_if_exception_type(ManagerUnavailable), before_sleep=self._register_waiting
        )
        registration: Registration = await retrying(
            self.manager.register, self.label, self.min_rate
        )
        self.progress.register_retry_at = None
        previous = self.state.state
        if previous.uuid and previous.uuid != registration.uuid:
            log.warning("manager.new_instance", old_uuid=previous.uuid, uuid=registration.uuid)
            await self.state.update(
                lambda st: SupervisorState(params_verified=st.params_verified, phase=st.phase)
            )
            self.outbox = Outbox.for_keeper(self.manager, self.state)
        self.uuid = registration.uuid
        uuid, runner = registration.uuid, registration.runner_id
        await self.state.update(
            lambda st: replace(st, uuid=uuid, runner_id=runner, label=self.label)
        )
        self.shipper.set_uuid(registration.uuid)
        logcontext.bind(uuid=registration.uuid)

    def _register_waiting(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self._register_failed(state.upcoming_sleep)
        # info: the client's own warnings name the URL at a steady cadence (away.py).
        log.info("manager.register_waiting", url=self.manager.base_url, reason=str(exc))

    def on_manager_retry(self, call: str, attempt: int, pause_s: float) -> None:
        """The manager client's retry listener: a failed ``/register`` attempt inside one call."""
        if call == "register" and self.progress.phase == "register":
            self._register_failed(pause_s)

    def _register_failed(self, pause_s: float) -> None:
        self.progress.register_failures += 1
        self.progress.register_retry_at = self.clock() + pause_s

    # --- reports ------------------------------------------------------------------------------

    async def params_done(self) -> None:
        """``/param-done`` queued, durable, sent by the outbox task: the warmup does not wait on
        the manager (its clock starts when it acknowledges: :meth:`bench_deadline`)."""
        acked = self.outbox.latest(PARAM_DONE)
        if acked is not None and acked.outcome == OUTCOME_OK:
            await self._start_bench_clock(resumed=True)
        if acked is None:
            await self.outbox.enqueue(self._report(PARAM_DONE))
        self.signals.outbox_kick.set()

    def answered_bench(self) -> Report | None:
        """The ``/bench-done`` of an earlier run that the manager answered, if any."""
        verdict = self.outbox.latest(BENCH_DONE)
        return verdict if verdict is not None and verdict.passed is not None else None

    def verdict_fields(self, report: Report) -> dict[str, Any]:
        """A finished ``/bench-done`` as log fields: its rate, and its verdict only where one
        was given (``passed`` None in a local run, where nobody judged the rate)."""
        judged = self.judged
        return {"rate": report.rate, "passed": report.passed if judged else None, "judged": judged}

    async def bench_done(self, rate: float) -> Report:
        """``/bench-done`` with ``rate`` (or the one a crash left queued), unless the instance
        was killed meanwhile (InstanceGone); returns it with the manager's verdict (none in a
        local run: ``bench.unjudged``)."""
        await self._check_alive()
        report = self._pending_bench() or self._report(BENCH_DONE, rate)
        done = await self.send(report)
        self.reported = True
        if not self.judged and done.rate:
            log.info("bench.unjudged", rate=done.rate, reason="no manager configured")
        return done

    async def running(self) -> None:
        await self.send(self._report(RUNNING))
        self.shipper.enter_run_phase()  # the run phase's log budget, after one more turn
        # The first ping anywhere in its interval: a fleet running together pings apart.
        interval = self.config.running_ping_interval_s
        self._next_ping_at = self.clock() + first_delay(interval, self.rng.random())

    async def send(self, report: Report) -> Report:
        """Send a report until the manager answers; InstanceGone ends the instance."""

        def waiting(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.warning("manager.report_waiting", kind=report.kind, reason=str(exc))

        retrying = self.retries.report.controller(
            retry_if_exception_type(ManagerUnavailable), before_sleep=waiting
        )
        try:
            return await retrying(self.outbox.send_now, report)
        except (InstanceGone, ManagerUnavailable):
            raise
        except ManagerError as exc:
            log.error("manager.report_rejected", kind=report.kind, reason=str(exc))
            return report

    async def report_failure(self, reason: str, *, durable: bool = True) -> None:
        """No silence: the reason to the log endpoint, and rate 0 if no rate was reported."""
        phase = self.progress.phase
        log.error("lifecycle.failed", reason=reason, phase=phase)
        self.shipper.add_line("setup", f"FAILED in {phase}: {reason}", milestone=True)
        if durable:
            with contextlib.suppress(StateWriteError):
                await self.state.update(lambda st: st.with_failure(reason))
        if self.uuid is None or self.reported:
            return
        report = self._pending_bench() or self._report(BENCH_DONE, 0.0)
        try:
            if durable:
                await self.outbox.send_now(report, deadline_s=60)
            else:
                await self.manager.bench_done(self.uuid, 0.0, stop_s=60)
            self.reported = True
        except (ManagerError, StateWriteError) as exc:
            log.error("manager.failure_unreported", reason=str(exc))

    def _report(self, kind: str, rate: float | None = None) -> Report:
        """A new report, stamped by the injected wall clock (the bench clock reads the stamp)."""
        return Report(
            kind=kind, uuid=self._uuid(), rate=rate, created_at=utc_now_iso(self.wall_clock)
        )

    def _pending_bench(self) -> Report | None:
        report = self.outbox.latest(BENCH_DONE)
        return report if report is not None and report.outcome is None else None

    # --- the outbox task ----------------------------------------------------------------------

    async def outbox_loop(self) -> None:
        """Send what the outbox holds, in order, whenever it holds something, so that progress
        never waits on the manager; while it is away, try again with a growing pause."""
        kick = self.signals.outbox_kick
        pause = 1.0
        while True:
            await kick.wait()
            kick.clear()
            while self.outbox.pending and not self.signals.gone.is_set():
                try:
                    result = await self.outbox.drain(deadline_s=self.config.manager_retry_s)
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
                jitter = self.config.manager_jitter
                wait_s = next_delay(pause if away else 1.0, jitter, self.rng.random())
                with contextlib.suppress(TimeoutError):
                    await within(kick.wait(), wait_s)
                kick.clear()
                if away:
                    pause = min(pause * 2, 30.0)

    async def _after_drain(self, sent: tuple[Report, ...]) -> None:
        for report in sent:
            if report.outcome == OUTCOME_GONE:
                self.signals.mark_gone(report.detail or f"{report.kind} answered 404")
            elif report.kind == PARAM_DONE and report.outcome == OUTCOME_OK:
                await self._start_bench_clock(queued_at=manager_time(report.created_at))

    # --- the manager's bench clock ------------------------------------------------------------

    def bench_deadline(self) -> float:
        """The end of the manager's benchmark budget, on the monotonic clock: its clock counts
        from its acknowledgement of /param-done (or its own ``param_done_at``), kept in the state
        file; until then the whole budget is still ahead (asked again at every decision)."""
        return bench_deadline(
            now_monotonic=self.clock(),
            now_wall=self.wall_clock(),
            clock_start=self.state.state.bench_clock_start,
            budget_s=self.config.bench_budget_s,
        )

    async def _start_bench_clock(
        self, *, resumed: bool = False, queued_at: float | None = None
    ) -> None:
        """The manager acknowledged /param-done: its 45-minute clock runs from then, or from its
        own ``param_done_at`` when the record shows an earlier one (kept in the state file).
        ``resumed``: acknowledged before this process, by a build that kept no clock; the local
        params-done time is the safe (earlier) guess. ``queued_at``: when the report was queued,
        never after the manager's stamp; acknowledged within one request's time of that
        (``core.benchclock.prompt_ack``), it is the start (earlier by at most that) and the
        whole table is not read: a fleet started together would read it all at once."""
        if self.state.state.bench_clock_start is not None:
            return
        now = self.wall_clock()
        start, source = now, "acknowledged"
        done_at = self.state.state.params_done_at
        if resumed and done_at is not None:
            start, source = done_at, "params done (resumed)"
        prompt_s = self.config.manager_connect_timeout_s + self.config.manager_read_timeout_s
        if not resumed and prompt_ack(queued_at, now, prompt_s):
            assert queued_at is not None
            await self.state.update(lambda st: replace(st, bench_clock_start=queued_at))
            log.info("bench.clock_started", source="queued, acknowledged promptly",
                     ago_s=round(now - queued_at, 1),
                     budget_s=self.config.bench_budget_s)  # fmt: skip
            return
        looked_up, record = await self._record(stop_s=min(10.0, self._status_read_s))
        stamped = manager_time(record.get("param_done_at")) if looked_up and record else None
        if stamped is not None and stamped < start:
            start, source = stamped, "manager param_done_at"
        await self.state.update(lambda st: replace(st, bench_clock_start=start))
        log.info("bench.clock_started", source=source, ago_s=round(self.wall_clock() - start, 1),
                 budget_s=self.config.bench_budget_s)  # fmt: skip
