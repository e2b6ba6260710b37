"""Client of the fleet manager (docs/manager-api.md) and the durable outbox of reports.

Rules (docs/architecture.md, rule 3, 6 and 9, incidents I2 and I5):

- Every call is bounded: short HTTP timeouts (:class:`ManagerTimeouts`) and, per call, a retry
  stop (:class:`ManagerRetry`). Requests go over one persistent connection per manager
  (:mod:`cuzk_supervisor.adapters.manager.http`, keep-alive where the manager allows it).
- **Only the manager's own word is final** (:mod:`cuzk_supervisor.core.answers`): a 404 whose
  JSON body carries its "instance not found" text on ``/param-done``, ``/bench-done`` or
  ``/running`` is :class:`InstanceGone` (this instance is finished), and its JSON 400 is
  :class:`ManagerRejected` (our request is wrong). ``passed: false`` from ``/bench-done`` is a
  value, ``BenchVerdict(passed=False)``. Everything else is **weather**, retried, never final:
  no answer (refused, timed out, dropped), HTML, plain-text or empty answers of any status (a
  proxy's 404 or 403 page, Go's ``404 page not found``), 401, 405, 413, 429, 5xx, and a 2xx
  that is not the API's answer.
- One backoff per manager, shared by all calls (``attempts``): every failed attempt of any call
  lengthens the pause before the next request of every call; a ``Retry-After`` (seconds or an
  HTTP-date) is a floor; while the manager is failing, one request at a time probes it. Failed
  attempts are counted (:attr:`ManagerClient.failures`) and told now and then, naming what
  answered (``away``); weather lasting ``weather_s`` (10 min) is one ``manager.weather`` line.
- No manager configured (``base_url=None``) is a local run: a report is logged once as
  ``manager.report_skipped`` (the same report again, e.g. the ``/running`` ping, only at debug)
  and answered locally. Nobody judges a rate there: a measured rate goes on, unjudged
  (``BenchVerdict(checked=False)``); a failure report (rate 0) is never called a pass.
- Reports other than register go through the durable ``outbox`` (the state file): delivery is
  at least once, safe with the real manager (``/param-done`` and ``/running`` are idempotent,
  ``/bench-done`` twice with the same rate gives the same verdict). A report found queued at
  start is first looked up in ``GET /status`` (:mod:`cuzk_supervisor.core.reconcile`): a
  ``/bench-done`` sent again would revive an instance the manager killed meanwhile.
- ``GET /status`` answers with the manager's whole table: it is read rarely (at a resume, before
  ``/bench-done``), never periodically. An empty list cannot be the manager's answer to a
  registered instance: it is a bad answer, retried and counted; a list without our record is
  no evidence of anything (:func:`cuzk_supervisor.core.reconcile.gone_reason`).
- The log push is one attempt (``once``): its lines stay in the shipper's buffer for its next
  turn, so a failed push never brings the next one sooner. A POST whose answer was lost (a read
  timeout) is retried: applying it twice is safe for the reasons above.
"""

from __future__ import annotations

import dataclasses
import json
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import structlog

from cuzk_supervisor.adapters.logship.push import (
    clean_source,
    encode_body,
    normalize_line,
    split_bodies,
)
from cuzk_supervisor.adapters.manager.answers import json_list, json_object
from cuzk_supervisor.adapters.manager.attempts import Attempts
from cuzk_supervisor.adapters.manager.away import FailureCounts
from cuzk_supervisor.adapters.manager.http import HttpTransport
from cuzk_supervisor.adapters.manager.values import (
    BadAnswer,
    BenchVerdict,
    ManagerRetry,
    ManagerTimeouts,
    Registration,
)
from cuzk_supervisor.adapters.manager.wire import (
    FunctionTransport,
    HttpAnswer,
    HttpRequest,
    Transport,
)
from cuzk_supervisor.adapters.state.doc import Report, utc_now_iso
from cuzk_supervisor.core.backoff import SharedBackoff
from cuzk_supervisor.core.reconcile import find_record, listing_problem
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE, RUNNING

# Re-exported: tests import the log push's wire pieces and the retry stop from here.
__all__ = ["ManagerClient", "ManagerRetry", "encode_body", "normalize_line", "split_bodies"]

log = structlog.get_logger("supervisor.manager")

WEATHER_S = 600.0  # weather this long is one manager.weather line (manager_weather_s)
PATHS = {"register": "/register", PARAM_DONE: "/param-done", BENCH_DONE: "/bench-done",
         RUNNING: "/running", "status": "/status", "log_push": "/api/log-push"}  # fmt: skip


class ManagerClient:
    """Async client of the manager. Use as ``async with ManagerClient(url) as client``.

    ``transport`` replaces the network (tests: a ``FunctionTransport``; by default one persistent
    ``HttpTransport``, with ``ssl_context`` for https). ``clock`` is the one clock of the retries,
    the warnings and the connection's idle expiry; ``rng`` draws the backoff's jitter;
    ``wall_clock`` reads a ``Retry-After`` given as an HTTP-date and stamps the reports it
    finishes. Nothing is global: the fleet benchmark runs a fleet of clients in one process.
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        timeouts: ManagerTimeouts | None = None,
        retry: ManagerRetry | None = None,
        transport: Transport | None = None,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        weather_s: float = WEATHER_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"manager URL must start with http:// or https://, got {base_url!r}")
        self.timeouts = timeouts if timeouts is not None else ManagerTimeouts()
        self.retry = retry if retry is not None else ManagerRetry()
        self._skipped_reports: set[tuple[str, str]] = set()
        self.clock = clock
        """The one clock of this manager's calls (the outbox's deadlines read it too)."""
        self.wall_clock = wall_clock
        self._headers = tuple((headers or {}).items())  # e.g. a token for a proxy; never logged
        self.transport: Transport | None = None
        if self.base_url is not None:
            self.transport = transport or HttpTransport(
                self.base_url, ssl_context=ssl_context, clock=clock
            )
        self._calls = Attempts(
            self.transport or FunctionTransport(_no_manager), self.base_url,
            self.timeouts, self.retry, clock=clock, wall_clock=wall_clock,
            rng=rng if rng is not None else random.Random(), weather_s=weather_s,
        )  # fmt: skip
        self.unlisted = 0
        """``GET /status`` answers that did not list this instance (no evidence of anything)."""

    @property
    def is_local(self) -> bool:
        return self.transport is None

    @property
    def backoff(self) -> SharedBackoff:
        """The one backoff of this manager, shared by every call."""
        return self._calls.backoff

    @property
    def requests(self) -> int:
        """Requests sent (attempts), all calls together."""
        return self._calls.requests

    @property
    def failures(self) -> FailureCounts:
        """Failed attempts so far, by call and by reason (never logged one by one)."""
        return self._calls.away.counts

    @property
    def weather_sustained(self) -> bool:
        """A sustained weather episode is going on (told by ``manager.weather``)."""
        return self._calls.weather.episodes.sustained

    def add_retry_listener(self, listener: Callable[[str, int, float], None]) -> None:
        """Called with ``(call, attempt, pause_s)`` at each failed attempt (before its pause)."""
        self._calls.away.listeners.append(listener)

    def add_weather_listener(self, listener: Callable[[bool, str], None]) -> None:
        """Called with ``(sustained, last answer)`` when a sustained weather episode is told,
        and when it is over."""
        self._calls.weather.listeners.append(listener)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()

    # -- calls --

    async def register(
        self, label: str, min_rate: float, *, stop_s: float | None = None
    ) -> Registration:
        """``POST /register``: idempotent per label at the manager, so retried freely."""
        if not label:
            raise ValueError("register needs a label")
        payload = {"label": label, "min_rate": min_rate}
        if self.transport is None:
            # Stable across restarts, so a resumed local run keeps its identity.
            registration = Registration(uuid=f"local-{label}", runner_id=0, local=True)
            self._skipped("register", payload, answer="local")
            return registration
        data = await self._post_json(
            "register", payload, None, stop_s, require={"uuid": str, "runner_id": int}
        )
        uuid, runner_id = data["uuid"], data["runner_id"]
        log.info("manager.registered", label=label, uuid=uuid, runner_id=runner_id)
        return Registration(uuid=uuid, runner_id=runner_id)

    async def param_done(self, uuid: str, *, stop_s: float | None = None) -> None:
        await self._report(PARAM_DONE, {"uuid": uuid}, stop_s)

    async def running(self, uuid: str, *, stop_s: float | None = None) -> None:
        await self._report(RUNNING, {"uuid": uuid}, stop_s)

    async def bench_done(
        self, uuid: str, rate: float, *, stop_s: float | None = None
    ) -> BenchVerdict:
        """``POST /bench-done``. A failed verdict is a value; the manager destroys the instance."""
        payload = {"uuid": uuid, "rate": rate}
        if self.transport is None:
            # A rate 0 is the failure report (docs/manager-api.md): never a pass.
            failure = not rate > 0
            note = (
                "no manager configured: the failure report (rate 0) was not sent"
                if failure
                else "no manager configured: the rate was not judged against a min_rate"
            )
            self._skipped(BENCH_DONE, payload, judged=False, note=note)
            return BenchVerdict(passed=not failure, rate=rate, checked=False)
        data = await self._report(BENCH_DONE, payload, stop_s, require={"passed": bool})
        passed = data["passed"]
        log.info("manager.bench_verdict", uuid=uuid, rate=rate, passed=passed)
        return BenchVerdict(passed=passed, rate=rate)

    async def send(self, report: Report, *, stop_s: float | None = None) -> Report:
        """Send one outbox report; return it finished with ``outcome="ok"`` (and the verdict).
        Raises InstanceGone, ManagerRejected or ManagerUnavailable."""
        passed: bool | None = None
        if report.kind == PARAM_DONE:
            await self.param_done(report.uuid, stop_s=stop_s)
        elif report.kind == RUNNING:
            await self.running(report.uuid, stop_s=stop_s)
        elif report.kind == BENCH_DONE:
            assert report.rate is not None  # Report validates this
            passed = (await self.bench_done(report.uuid, report.rate, stop_s=stop_s)).passed
        else:  # pragma: no cover - Report validates kinds
            raise ValueError(f"unknown report kind {report.kind!r}")
        finished = utc_now_iso(self.wall_clock)
        return dataclasses.replace(report, outcome=OUTCOME_OK, passed=passed, finished_at=finished)

    async def instance_record(
        self, uuid: str, *, stop_s: float | None = None
    ) -> Mapping[str, Any] | None:
        """This instance's record in ``GET /status`` (None: not listed, or no manager).

        An answer that cannot be the manager's (not a list, or an empty list: we registered, so
        it lists us) is a bad answer, retried like an outage and counted; a list without our
        record is None and counted (:attr:`unlisted`), no evidence of a kill (module docstring)."""
        if self.transport is None:
            return None
        request = HttpRequest("GET", "/status", self._headers)
        answer = await self._calls.call(
            "status", request, path="/status", stop_s=stop_s, check=_status_listing
        )
        record = find_record(json_list(answer), uuid)
        if record is None:
            self.unlisted += 1
            detail = "GET /status did not list this instance: not taken as a kill"
            log.info("manager.status_unlisted", uuid=uuid, unlisted=self.unlisted, detail=detail)
        return record

    async def push_logs(
        self, uuid: str, source: str, lines: Sequence[str], *, stop_s: float | None = None
    ) -> int:
        """``POST /api/log-push``, one attempt a body (none while the shared backoff holds
        requests back: ManagerUnavailable, the caller keeps the lines); return the bodies sent.
        No body exceeds 256 KiB (the manager would drop the rest silently)."""
        if self.transport is None:
            return 0
        headers = (
            *self._headers,
            ("X-Instance-UUID", uuid),
            ("X-Log-Source", clean_source(source)),
            ("Content-Type", "text/plain; charset=utf-8"),
        )
        bodies = split_bodies(lines)
        for group in bodies:
            request = HttpRequest("POST", "/api/log-push", headers, encode_body(group))
            await self._calls.call(
                "log_push", request, path="/api/log-push", stop_s=stop_s, once=True,
                check=_pushed,
            )  # fmt: skip
        return len(bodies)

    # -- plumbing --

    async def _report(
        self,
        call: str,
        payload: dict[str, Any],
        stop_s: float | None,
        require: Mapping[str, type] | None = None,
    ) -> dict[str, Any]:
        if self.transport is None:
            self._skipped(call, payload, answer="ok")
            return {"ok": True}
        expected = {"ok": bool, **(require or {})}
        return await self._post_json(call, payload, str(payload.get("uuid")), stop_s, expected)

    def _skipped(self, call: str, payload: Mapping[str, Any], **fields: Any) -> None:
        """Local run: a report is logged once; the same report again only at debug."""
        key = (call, json.dumps(payload, sort_keys=True, default=str))
        first = key not in self._skipped_reports
        self._skipped_reports.add(key)
        (log.info if first else log.debug)(
            "manager.report_skipped", call=call, payload=dict(payload), **fields
        )

    async def _post_json(
        self,
        call: str,
        payload: dict[str, Any],
        uuid: str | None,
        stop_s: float | None,
        require: Mapping[str, type],
    ) -> dict[str, Any]:
        path = PATHS[call]
        request = HttpRequest.of_json("POST", path, payload)
        request = dataclasses.replace(request, headers=(*self._headers, *request.headers))
        answer = await self._calls.call(
            call, request, path=path, uuid=uuid, stop_s=stop_s,
            check=lambda a: json_object(a, require),
        )  # fmt: skip
        return json_object(answer, require)


def _no_manager(request: HttpRequest) -> HttpAnswer:
    raise AssertionError("a local run sends nothing")  # pragma: no cover - never called


def _pushed(answer: HttpAnswer) -> None:
    """The manager answers a log push with an empty 204: a 2xx with a body (a maintenance
    page) is not it."""
    if answer.body.strip():
        raise BadAnswer(answer.status, "a body where the manager answers none", answer.body)


def _status_listing(answer: HttpAnswer) -> None:
    """A ``GET /status`` answer that can be the manager's (see ``instance_record``)."""
    problem = listing_problem(json_list(answer))
    if problem is not None:
        raise BadAnswer(answer.status, problem, answer.body)
