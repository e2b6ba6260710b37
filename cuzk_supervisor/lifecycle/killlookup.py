"""The manager's view of this instance: the look-ups of a kill from the dashboard and the
``/running`` ping, as the base of the reporter (``reporting.Reporter``).

How a kill is found, at a cost per machine that does not grow with the fleet (docs/architecture.md
principle 9; docs/manager.md): in the run phase the jittered ``/running`` ping answers 404 once
the record is killed; before ``/bench-done`` (which would revive a killed record: the manager
does not check the state) one ``/running`` asks the same; the whole table (``GET /status``) is
read only to say why at the end, at a resume, after a slow ``/param-done`` acknowledgement, or at
``manager_status_lookup_s`` when set. Only the manager's own word ends the instance (its JSON 404
on a report, our record in state ``killed``); a record missing from a listing or a proxy's page
(weather) never does, nor switches anything off.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import (
    InstanceGone,
    ManagerError,
    ManagerRejected,
    ManagerUnavailable,
)
from cuzk_supervisor.core.jitter import first_delay, next_delay
from cuzk_supervisor.core.reconcile import gone_reason
from cuzk_supervisor.lifecycle.shared import Signals
from cuzk_supervisor.lifecycle.values import ReporterSettings

log = structlog.get_logger()

LOOKUP_PHASES = frozenset({"params", "plan", "warmup", "restart", "settle", "bench"})
"""Phases in which ``manager_status_lookup_s`` (when not 0) reads the whole table for a kill:
before the run phase, where no per-instance call shows one (``/param-done`` says ok on a killed
record, ``/running`` would move it to running for the whole phase). The report phase asks one
``/running`` just before ``/bench-done``."""


class KillLookup:
    """The kill look-ups and the ``/running`` ping; the reporter that inherits them has what
    they read."""

    config: ReporterSettings
    manager: ManagerClient
    uuid: str | None
    signals: Signals
    clock: Callable[[], float]
    rng: random.Random
    _next_ping_at: float
    _next_lookup_at: float | None

    def _uuid(self) -> str:
        assert self.uuid is not None
        return self.uuid

    @property
    def _status_read_s(self) -> float:
        """How long the check before ``/bench-done`` or one read of the whole table is retried
        (within one report's window)."""
        return min(self.config.manager_status_read_s, self.config.manager_retry_s)

    async def look_up_kill(self, *, stop_s: float) -> str | None:
        """The reason the manager's record says we are killed, or None (alive, not listed, or
        not known: only the record in state ``killed`` is evidence)."""
        looked_up, record = await self._record(stop_s=stop_s)
        return gone_reason(record) if looked_up else None

    def lookup_due(self, phase: str) -> bool:
        """Time for the periodic read of the whole table (never when ``manager_status_lookup_s``
        is 0, nor in the run phase: the /running ping answers 404 once killed)."""
        interval = self.config.manager_status_lookup_s
        if interval <= 0 or phase not in LOOKUP_PHASES or self.uuid is None:
            return False
        now = self.clock()
        if self._next_lookup_at is None:
            self._next_lookup_at = now + first_delay(interval, self.rng.random())
        if now < self._next_lookup_at:
            return False
        self._next_lookup_at = now + next_delay(
            interval, self.config.manager_jitter, self.rng.random()
        )
        return True

    def ping_due(self) -> bool:
        return bool(self.uuid) and self.clock() >= self._next_ping_at

    async def ping(self, *, stop_s: float) -> bool:
        """A repeated (idempotent) /running as the liveness ping and the run phase's kill
        look-up (404 once killed); False: the instance is gone."""
        interval, jitter = self.config.running_ping_interval_s, self.config.manager_jitter
        self._next_ping_at = self.clock() + next_delay(interval, jitter, self.rng.random())
        return await self._gone_by_running(stop_s=stop_s) is None

    async def _gone_by_running(self, *, stop_s: float) -> str | None:
        """One ``/running``: why the instance is gone when the manager answers 404 (its word on
        this uuid), else None (alive, or not answered: weather, an outage or a 400, never a
        kill)."""
        try:
            await self.manager.running(self._uuid(), stop_s=stop_s)
        except InstanceGone as exc:
            # The record, read once now (the end of this instance's life), says why.
            reason = await self.look_up_kill(stop_s=stop_s) or f"/running answered: {exc.message}"
            self.signals.mark_gone(reason)
            return reason
        except ManagerError as exc:
            log.info("manager.ping_failed", reason=str(exc))
        return None

    async def _record(self, *, stop_s: float) -> tuple[bool, Mapping[str, Any] | None]:
        """(looked up, this instance's record in GET /status or None when it is not listed);
        not looked up: no manager, the manager away or answering what cannot be its own (a
        proxy's page, an empty list: weather, counted by the client). Nothing is switched off
        by an answer: the next look-up asks again."""
        if self.manager.is_local or self.uuid is None:
            return False, None
        try:
            return True, await self.manager.instance_record(self.uuid, stop_s=stop_s)
        except (ManagerUnavailable, ManagerRejected) as exc:
            log.info("manager.status_not_read", reason=str(exc))
            return False, None

    async def _check_alive(self) -> None:
        """Before ``/bench-done``, which would revive a record killed from the dashboard: one
        ``/running``, answered 404 once the record is killed, at one small request at any fleet
        size (the whole table is about 290 bytes a row). On a live record its only trace is the
        state ``running`` until the ``/bench-done`` that follows moves it to ``bench_done``. Not
        answered in ``manager_status_read_s``, the report is sent unchecked."""
        if self.manager.is_local or self.uuid is None:
            return
        reason = await self._gone_by_running(stop_s=self._status_read_s)
        if reason is not None:
            raise InstanceGone("running", self._uuid(), reason)
