"""How a run of the phase machine ends: a failure, the manager's kill, a verdict that stands.

``RunEndings`` is the part of :class:`~cuzk_supervisor.lifecycle.machine.Lifecycle` around the
phases (its base): a failure anywhere is a value with a reason told to the manager (rate 0,
incident I2) and a documented exit code, never a traceback; a kill by the manager cuts the phases
short and nothing more is reported (a report would revive the instance); a terminal verdict is
written to the state file and stands on the next start, which reports it again, starts nothing and
stays up until stopped (so a restart policy does not loop registrations and benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import structlog

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.manager.values import InstanceGone
from cuzk_supervisor.adapters.state.doc import utc_now_iso
from cuzk_supervisor.adapters.state.store import StateKeeper, StateWriteError
from cuzk_supervisor.lifecycle import ports
from cuzk_supervisor.lifecycle.shared import (
    LifecycleFailure,
    Progress,
    Signals,
    cancel_and_wait,
    innermost_frame,
)
from cuzk_supervisor.lifecycle.values import PhaseSettings

log = structlog.get_logger()

# Verdicts that stand across a restart of the container (see SupervisorState.verdict).
TERMINAL_CODES = frozenset(
    {exitcodes.BENCH_FAILED, exitcodes.INSTANCE_GONE, exitcodes.OUT_OF_MEMORY,
     exitcodes.HEALTH_BROKEN}
)  # fmt: skip


class RunEndings:
    """The ends of a run (a base of ``Lifecycle``, which sets these attributes and gives the
    phases, ``_phases``, and the durable entry into a phase, ``_enter``)."""

    config: PhaseSettings
    state: StateKeeper
    shipper: LogShipper
    progress: Progress
    signals: Signals
    daemon: ports.Daemon
    reporter: ports.Reports
    last_verdict_reason: str

    @property
    def last_failure(self) -> str:
        return self.progress.last_failure

    async def _phases(self) -> int:
        raise NotImplementedError

    async def _enter(self, phase: str) -> None:
        raise NotImplementedError

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

    async def _run_to_a_code(self) -> int:
        try:
            return await self._run_unless_gone()
        except LifecycleFailure as failure:
            self.last_verdict_reason = failure.reason
            await self.reporter.report_failure(failure.reason)
            return failure.exit_code
        except StateWriteError as exc:
            log.error("state.unwritable", reason=str(exc))
            await self.reporter.report_failure(f"state file unwritable: {exc}", durable=False)
            return exitcodes.STATE_UNWRITABLE
        except Exception as exc:
            # The top-level guard: a bug or an unforeseen OS error is still one event, a reason
            # told to the manager and a documented code, never a traceback on the way out.
            where = innermost_frame(exc)
            reason = f"unexpected {type(exc).__name__}: {exc} ({where})"
            log.error("supervisor.crashed", reason=reason, phase=self.progress.phase)
            await self.reporter.report_failure(reason)
            return exitcodes.FAILURE

    async def _run_unless_gone(self) -> int:
        """The lifecycle, cut short when the manager killed this instance: nothing more is sent
        (a report would revive it), the daemon is stopped, the reason is pushed."""
        body = asyncio.ensure_future(self._phases())
        gone = asyncio.ensure_future(self.signals.gone.wait())
        try:
            await asyncio.wait({body, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # a signal: the phases end before run() stops the daemon
            await cancel_and_wait(body)
            raise
        finally:
            gone.cancel()
        if body.done():
            try:
                return body.result()
            except InstanceGone as exc:
                return await self._end_gone(exc.message)
        await cancel_and_wait(body)
        return await self._end_gone(self.signals.gone_reason)

    async def _end_gone(self, reason: str) -> int:
        self.last_verdict_reason = f"instance gone: {reason}"
        log.warning("manager.instance_gone", reason=reason, phase=self.progress.phase)
        self.reporter.reported = True  # nothing may be reported for a killed instance
        self.shipper.add_line(
            "setup", f"instance gone in {self.progress.phase}: {reason}", milestone=True
        )
        await self.daemon.stop()
        with contextlib.suppress(StateWriteError):
            await self.state.update(lambda st: st.with_failure(f"instance gone: {reason}"))
        return exitcodes.INSTANCE_GONE

    async def _stay_finished(self, verdict: Mapping[str, Any]) -> int:
        """A terminal verdict stands: report it again, start nothing, stay up until stopped."""
        reason = str(verdict.get("reason", ""))
        self.progress.last_failure = f"finished: {reason}"
        if self.state.state.uuid:
            self.shipper.set_uuid(self.state.state.uuid)
        await self._enter("finished")
        log.warning("lifecycle.finished", exit_code=verdict.get("exit_code"), reason=reason,
                    detail="a terminal verdict from an earlier run; remove the state file "
                           "to start over")  # fmt: skip
        self.shipper.add_line("setup", f"finished earlier: {reason}", milestone=True)
        if self.config.exit_after_run:
            code = verdict.get("exit_code")
            return code if isinstance(code, int) else exitcodes.FAILURE
        await asyncio.Event().wait()  # until the signal cancels us
        return exitcodes.OK  # pragma: no cover - never reached
