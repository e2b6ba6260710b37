"""The durable outbox of reports to the manager (see :mod:`.client`).

A report is written to the state file before it is sent and removed only after the manager
acknowledged it (delivery at least once); a report found queued at start is first looked up in
the manager's ``GET /status`` (:mod:`cuzk_supervisor.core.reconcile`) so that nothing the
manager already recorded is sent again. Only the manager's own word finishes a report (its
answer, its JSON 404: gone, its JSON 400: rejected); weather (a proxy's page, a 429, a 5xx,
no answer) never drops one: the client retries it under its shared backoff, and a report whose
send ran out of time stays queued, durable, for the next drain.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from cuzk_supervisor.adapters.manager.values import (
    InstanceGone,
    ManagerError,
    ManagerRejected,
    ManagerUnavailable,
)
from cuzk_supervisor.adapters.state.doc import Report, utc_now_iso
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.core.reconcile import RECONCILED_KINDS, recorded_outcome
from cuzk_supervisor.core.reports import OUTCOME_GONE, OUTCOME_REJECTED

__all__ = ["DrainResult", "Outbox", "SaveOutbox"]

log = structlog.get_logger("supervisor.manager")


class ReportSender(Protocol):
    """What the outbox needs of the manager's client (``client.ManagerClient``), named here so
    that the client imports the outbox and not both ways."""

    clock: Callable[[], float]
    wall_clock: Callable[[], float]

    async def send(self, report: Report, *, stop_s: float | None = None) -> Report: ...

    async def instance_record(
        self, uuid: str, *, stop_s: float | None = None
    ) -> Mapping[str, Any] | None: ...


SaveOutbox = Callable[[tuple[Report, ...], tuple[Report, ...]], Awaitable[None]]
"""Persists ``(pending, acked)`` in the state file; must raise if it could not (then nothing is
sent). :meth:`cuzk_supervisor.adapters.state.store.StateKeeper.save_outbox` is one."""


@dataclass(frozen=True, slots=True)
class DrainResult:
    sent: tuple[Report, ...]
    """Reports finished by this drain (outcome ok, gone or rejected), in order."""
    pending: int
    """Reports still waiting."""
    error: ManagerError | None = None
    """Why the drain stopped early (ManagerUnavailable: the manager is away)."""

    @property
    def gone(self) -> bool:
        return any(report.outcome == OUTCOME_GONE for report in self.sent)


class Outbox:
    """Durable, ordered reports to the manager: written to the state file before any send.

    One report is in flight at a time, in queue order. A report leaves the queue after its first
    acknowledgement, or after an answer that retrying cannot change (404: gone; another 4xx:
    rejected); it then joins ``acked``, the last ``keep_acked`` finished reports, kept in the
    state file too so that a verdict acknowledged just before a crash is not lost.
    """

    def __init__(
        self,
        client: ReportSender,
        save: SaveOutbox,
        pending: Iterable[Report] = (),
        acked: Iterable[Report] = (),
        *,
        keep_acked: int = 8,
    ) -> None:
        if keep_acked < 1:
            raise ValueError("keep_acked must be >= 1")
        self.client = client
        self._save = save
        self._pending: list[Report] = [r for r in pending if r.pending]
        self._acked: list[Report] = list(acked)[-keep_acked:]
        self._keep_acked = keep_acked
        # Reports loaded from the state file are on disk already, and may have been applied by
        # the manager just before the crash that left them queued: looked up before a resend.
        self._durable: set[str] = {r.id for r in self._pending}
        self._unverified: set[str] = {r.id for r in self._pending if r.kind in RECONCILED_KINDS}
        # Everything finished by this process, even once pruned from ``acked`` (a handful).
        self._finished: dict[str, Report] = {r.id: r for r in self._acked}
        self._send_lock = asyncio.Lock()

    @classmethod
    def for_keeper(cls, client: ReportSender, keeper: StateKeeper) -> Outbox:
        """The outbox as it was left in the state file (after a restart: what is still due)."""
        state = keeper.state
        return cls(client, keeper.save_outbox, state.outbox, state.acked)

    @property
    def pending(self) -> tuple[Report, ...]:
        return tuple(self._pending)

    @property
    def acked(self) -> tuple[Report, ...]:
        return tuple(self._acked)

    def find(self, report_id: str) -> Report | None:
        for report in self._pending:
            if report.id == report_id:
                return report
        return self._finished.get(report_id)

    def latest(self, kind: str) -> Report | None:
        """The most recent report of ``kind``, pending or finished (to resume after a crash)."""
        for report in (*reversed(self._pending), *reversed(self._acked)):
            if report.kind == kind:
                return report
        return None

    async def enqueue(self, report: Report) -> None:
        """Queue ``report`` and write the state file; only then may it be sent. Idempotent by id.
        Raises what the save raises (StateWriteError); the report is then not queued."""
        if self.find(report.id) is not None:
            return
        if not report.pending:
            raise ValueError(f"report {report.id} is finished and no longer known here")
        self._pending.append(report)
        try:
            await self._persist()
        except BaseException:
            self._pending.remove(report)
            raise
        self._durable.add(report.id)
        log.info("manager.report_queued", kind=report.kind, id=report.id, queued=len(self._pending))

    async def send_now(self, report: Report, deadline_s: float | None = None) -> Report:
        """Queue ``report`` (if new), send everything before it and then it; return it finished.

        For bench_done, ``.passed`` is the verdict. Raises InstanceGone (404), ManagerRejected
        (another 4xx), ManagerUnavailable (away until the retry stop or ``deadline_s``: the report
        stays queued), or StateWriteError. A report already finished (e.g. acknowledged before a
        crash) is not sent again: its recorded outcome is returned (or raised).
        """
        await self.enqueue(report)
        deadline = None if deadline_s is None else self.client.clock() + deadline_s
        async with self._send_lock:
            while True:
                done = self.find(report.id)
                if done is not None and not done.pending:
                    return _raise_for(done)
                head = self._pending[0]
                await self._deliver(head, self._remaining(deadline))

    async def drain(self, deadline_s: float | None = None) -> DrainResult:
        """Send queued reports in order until none is left, the manager is away, or
        ``deadline_s`` passes. Errors are returned, not raised (except StateWriteError)."""
        deadline = None if deadline_s is None else self.client.clock() + deadline_s
        sent: list[Report] = []
        error: ManagerError | None = None
        async with self._send_lock:
            while self._pending:
                head = self._pending[0]
                if head.id not in self._durable:
                    break  # still being written by its enqueue: its sender will send it
                try:
                    sent.append(await self._deliver(head, self._remaining(deadline)))
                except ManagerUnavailable as exc:
                    error = exc
                    break
        return DrainResult(tuple(sent), len(self._pending), error)

    async def _deliver(self, report: Report, budget_s: float | None) -> Report:
        """Send the head report; record how it ended. ManagerUnavailable leaves it queued."""
        if budget_s is not None and budget_s <= 0:
            raise ManagerUnavailable(report.kind, 0, "deadline passed before sending")
        clock = self.client.clock
        started = clock()
        try:
            done = await self._recorded(report, budget_s)
            if done is None:
                left = None if budget_s is None else budget_s - (clock() - started)
                done = await self.client.send(report, stop_s=left)
        except InstanceGone as exc:
            done = self._ended(report, OUTCOME_GONE, exc.message)
            log.warning("manager.report_gone", kind=report.kind, id=report.id, detail=exc.message)
        except ManagerRejected as exc:
            done = self._ended(report, OUTCOME_REJECTED, f"{exc.status} {exc.message}")
            log.error(
                "manager.report_rejected",
                kind=report.kind,
                id=report.id,
                status=exc.status,
                detail=exc.message,
            )
        self._pending.remove(report)
        self._durable.discard(report.id)
        self._acked.append(done)
        del self._acked[: -self._keep_acked]
        self._finished[done.id] = done
        await self._persist()
        log.info("manager.report_done", kind=report.kind, id=report.id, outcome=done.outcome)
        return done

    async def _recorded(self, report: Report, budget_s: float | None) -> Report | None:
        """For a report left queued by an earlier process: how the manager's records show it
        ended (None: send it). ManagerUnavailable propagates (the report stays queued)."""
        if report.id not in self._unverified:
            return None
        try:
            record = await self.client.instance_record(report.uuid, stop_s=budget_s)
        except (ManagerUnavailable, ManagerRejected) as exc:
            if isinstance(exc, ManagerUnavailable) and not exc.bad_answer:
                raise  # away, down or busy: the report stays queued, looked up when it is back
            # A manager without a usable /status, or something answering for it never with a
            # listing that can be its own (an empty list, a 403 page on the dashboard's API): no
            # evidence either way, so at-least-once delivery, which is safe. Nothing is switched
            # off: the next report queued by an earlier process is looked up again.
            log.warning(
                "manager.reconcile_skipped", kind=report.kind, id=report.id, reason=str(exc)
            )
            record = None
        self._unverified.discard(report.id)
        found = recorded_outcome(report, record)
        if found is None:
            return None
        done = self._ended(report, found.outcome, found.detail, passed=found.passed)
        log.info("manager.report_reconciled", kind=report.kind, id=report.id,
                 outcome=done.outcome, passed=done.passed, detail=done.detail)  # fmt: skip
        return done

    async def _persist(self) -> None:
        await self._save(tuple(self._pending), tuple(self._acked))

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - self.client.clock()

    def _ended(self, report: Report, outcome: str, detail: str, **more: Any) -> Report:
        stamp = utc_now_iso(self.client.wall_clock)
        return dataclasses.replace(
            report, outcome=outcome, detail=detail, finished_at=stamp, **more
        )


def _raise_for(report: Report) -> Report:
    if report.outcome == OUTCOME_GONE:
        raise InstanceGone(report.kind, report.uuid, report.detail)
    if report.outcome == OUTCOME_REJECTED:
        status, _, message = report.detail.partition(" ")
        raise ManagerRejected(report.kind, int(status) if status.isdigit() else 0, message)
    return report
