"""Client of the fleet manager (reference/manager-api.md) and the durable outbox of reports.

Rules (DESIGN.md principles 5 and 6, incidents I2 and I5):

- Every call is bounded: short HTTP timeouts (:class:`ManagerTimeouts`) and, per call, a retry
  stop (:class:`ManagerRetry`). Only what is known to be transient is retried: connection
  errors, timeouts, a dropped connection, 5xx, 408 and 429 (a proxy's "not now", for every
  call, register included), and a 2xx that is not the API's answer. Another 4xx is an answer,
  never retried.
- One backoff per manager, shared by all calls (:class:`cuzk_supervisor.core.backoff.
  SharedBackoff`, DESIGN.md principle 9): every failed attempt of any call lengthens the pause
  before the next request of every call; a ``Retry-After`` (seconds or an HTTP-date) on a 429
  or 503 is a floor that no request goes before; while the manager is failing, one request at a
  time probes it. Failed attempts are counted (:attr:`ManagerClient.failures`) and summed up
  in a line now and then (:mod:`cuzk_supervisor.adapters.manager.away`), never logged one by
  one.
- A 404 on ``/param-done``, ``/bench-done`` or ``/running`` means the manager no longer knows a
  live instance (killed, destroyed): :class:`InstanceGone`, this instance is finished.
  ``passed: false`` from ``/bench-done`` is a value, ``BenchVerdict(passed=False)``.
- No manager configured (``base_url=None``) is a local run: a report is logged once as
  ``manager.report_skipped`` (the same report again, e.g. the ``/running`` ping, only at debug)
  and answered locally. Nobody judges a rate there: a measured rate goes on, unjudged
  (``BenchVerdict(checked=False)``); a failure report (rate 0) is never called a pass.
- Reports other than register go through the :class:`Outbox`, stored in the state file: a
  report is written to disk before it is sent, and removed only after the manager acknowledged
  it. A crash in between leaves it queued: delivery is at least once. That is safe with the
  real manager: ``/param-done`` and ``/running`` are idempotent, and ``/bench-done`` applied
  twice with the same rate gives the same verdict. Still, a report found queued at start is
  first looked up in the manager's ``GET /status`` (:mod:`cuzk_supervisor.core.reconcile`),
  because a ``/bench-done`` sent again would revive an instance the manager killed meanwhile;
  only what the manager has not recorded is sent again. A report is removed right after its
  first 2xx, so it is sent at most once per acknowledgement.
- ``GET /status`` answers with the manager's whole table: it is read rarely (at a resume, before
  ``/bench-done``), never periodically. An empty list cannot be the manager's answer to a
  registered instance: it is a bad answer, retried and counted; a list without our record is
  no evidence of anything (:func:`cuzk_supervisor.core.reconcile.gone_reason`).

Retrying a POST whose answer was lost (a read timeout) may apply it twice for the same reasons
above; that is why read timeouts are retried too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx
import structlog

from cuzk_supervisor.adapters.logship.push import (
    MAX_BODY_BYTES,
    clean_source,
    encode_body,
    normalize_line,
    split_bodies,
)
from cuzk_supervisor.adapters.manager.answers import error_message, json_list, json_object
from cuzk_supervisor.adapters.manager.away import AwayWarnings, FailureCounts
from cuzk_supervisor.adapters.manager.outbox import DrainResult, Outbox, SaveOutbox
from cuzk_supervisor.adapters.manager.values import (
    THROTTLED_STATUSES,
    BadAnswer,
    BenchVerdict,
    HttpRetryPolicy,
    InstanceGone,
    ManagerError,
    ManagerRejected,
    ManagerRetry,
    ManagerTimeouts,
    ManagerUnavailable,
    Registration,
    ServerError,
    describe_failure,
    is_transient,
)
from cuzk_supervisor.adapters.state.doc import Report, utc_now_iso
from cuzk_supervisor.core.backoff import SharedBackoff, parse_retry_after
from cuzk_supervisor.core.reconcile import find_record, listing_problem
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE, RUNNING

# The client's own names, and (re-exported) the values, the wire format and the outbox that
# importers have always found here.
__all__ = [
    "MAX_BODY_BYTES",
    "BenchVerdict",
    "DrainResult",
    "HttpRetryPolicy",
    "InstanceGone",
    "ManagerClient",
    "ManagerError",
    "ManagerRejected",
    "ManagerRetry",
    "ManagerTimeouts",
    "ManagerUnavailable",
    "Outbox",
    "Registration",
    "Report",
    "SaveOutbox",
    "encode_body",
    "is_transient",
    "normalize_line",
    "split_bodies",
]

log = structlog.get_logger("supervisor.manager")


# --- the client ---------------------------------------------------------------------------------


class ManagerClient:
    """Async client of the manager. Use as ``async with ManagerClient(url) as client``.

    ``base_url=None`` is a local run (no manager): reports are logged and answered locally.
    ``transport`` replaces the network (tests use ``httpx.MockTransport``). ``clock`` times the
    away warnings; ``rng`` draws the backoff's jitter (a seeded ``random.Random`` in tests);
    ``wall_clock`` reads a ``Retry-After`` given as an HTTP-date. Nothing is global: a process
    may hold many clients (the fleet benchmark runs a fleet of them).
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        timeouts: ManagerTimeouts | None = None,
        retry: ManagerRetry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"manager URL must start with http:// or https://, got {base_url!r}")
        self.timeouts = timeouts if timeouts is not None else ManagerTimeouts()
        self.retry = retry if retry is not None else ManagerRetry()
        self._http: httpx.AsyncClient | None = None
        self._skipped_reports: set[tuple[str, str]] = set()
        self._away = AwayWarnings(self.base_url, every_s=self.retry.warn_every_s, clock=clock)
        self._rng = rng if rng is not None else random.Random()
        self._wall = wall_clock
        self.backoff = SharedBackoff(
            self.retry.backoff_base_s, self.retry.backoff_max_s, self.retry.retry_after_max_s
        )
        """The one backoff of this manager, shared by every call."""
        self._probe = asyncio.Lock()  # while failing: one request at a time
        self.requests = 0
        """Requests sent (attempts), all calls together."""
        self.unlisted = 0
        """``GET /status`` answers that did not list this instance (no evidence of anything)."""
        if self.base_url is not None:
            self._http = httpx.AsyncClient(
                base_url=self.base_url,
                timeout=self.timeouts.as_httpx(),
                transport=transport,
                headers=dict(headers or {}),  # e.g. a token for a proxy; never logged
            )

    @property
    def is_local(self) -> bool:
        return self._http is None

    def add_retry_listener(self, listener: Callable[[str, int, float], None]) -> None:
        """Called with ``(call, attempt, pause_s)`` at each failed attempt (before its pause)."""
        self._away.listeners.append(listener)

    @property
    def failures(self) -> FailureCounts:
        """Failed attempts so far, by call and by reason (never logged one by one)."""
        return self._away.counts

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
        if self._http is not None:
            await self._http.aclose()

    # -- calls --

    async def register(
        self, label: str, min_rate: float, *, stop_s: float | None = None
    ) -> Registration:
        """``POST /register``: idempotent per label at the manager, so retried freely."""
        if not label:
            raise ValueError("register needs a label")
        payload = {"label": label, "min_rate": min_rate}
        if self._http is None:
            # Stable across restarts, so a resumed local run keeps its identity.
            registration = Registration(uuid=f"local-{label}", runner_id=0, local=True)
            self._skipped("register", payload, answer="local")
            return registration
        data = await self._post_json(
            "register", "/register", payload, stop_s, require={"uuid": str, "runner_id": int}
        )
        uuid, runner_id = data["uuid"], data["runner_id"]
        log.info("manager.registered", label=label, uuid=uuid, runner_id=runner_id)
        return Registration(uuid=uuid, runner_id=runner_id)

    async def param_done(self, uuid: str, *, stop_s: float | None = None) -> None:
        await self._report(PARAM_DONE, "/param-done", {"uuid": uuid}, stop_s)

    async def running(self, uuid: str, *, stop_s: float | None = None) -> None:
        await self._report(RUNNING, "/running", {"uuid": uuid}, stop_s)

    async def bench_done(
        self, uuid: str, rate: float, *, stop_s: float | None = None
    ) -> BenchVerdict:
        """``POST /bench-done``. A failed verdict is a value; the manager destroys the instance."""
        payload = {"uuid": uuid, "rate": rate}
        if self._http is None:
            # A rate 0 is the failure report (reference/manager-api.md): never a pass.
            failure = not rate > 0
            note = (
                "no manager configured: the failure report (rate 0) was not sent"
                if failure
                else "no manager configured: the rate was not judged against a min_rate"
            )
            self._skipped(BENCH_DONE, payload, judged=False, note=note)
            return BenchVerdict(passed=not failure, rate=rate, checked=False)
        data = await self._report(
            BENCH_DONE, "/bench-done", payload, stop_s, require={"passed": bool}
        )
        passed = data["passed"]
        log.info("manager.bench_verdict", uuid=uuid, rate=rate, passed=passed)
        return BenchVerdict(passed=passed, rate=rate)

    async def send(self, report: Report, *, stop_s: float | None = None) -> Report:
        """Send one outbox report; return it finished with ``outcome="ok"`` (and the verdict).

        Raises InstanceGone, ManagerRejected or ManagerUnavailable.
        """
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
        return dataclasses.replace(
            report, outcome=OUTCOME_OK, passed=passed, finished_at=utc_now_iso()
        )

    async def instance_record(
        self, uuid: str, *, stop_s: float | None = None
    ) -> Mapping[str, Any] | None:
        """This instance's record in ``GET /status`` (None: not listed, or no manager).

        The manager answers with its whole table: call this rarely (a resume, before
        ``/bench-done``). An answer that cannot be the manager's (not a list, or an empty list:
        we registered, so it lists us) is a bad answer, retried like an outage and counted;
        a list without our record is returned as None and counted (:attr:`unlisted`): it is
        no evidence of a kill (:func:`cuzk_supervisor.core.reconcile.gone_reason`)."""
        if self._http is None:
            return None
        response = await self._request(
            "status", "/status", stop_s, method="GET", check=_status_listing
        )
        record = find_record(response.json(), uuid)
        if record is None:
            self.unlisted += 1
            detail = "GET /status did not list this instance: not taken as a kill"
            log.info("manager.status_unlisted", uuid=uuid, unlisted=self.unlisted, detail=detail)
        return record

    async def push_logs(
        self, uuid: str, source: str, lines: Sequence[str], *, stop_s: float | None = None
    ) -> int:
        """``POST /api/log-push``; return the number of bodies sent.

        Lines are normalised and split so that no body exceeds 256 KiB (the manager would drop
        the rest silently). A no-op without a manager.
        """
        if self._http is None:
            return 0
        headers = {
            "X-Instance-UUID": uuid,
            "X-Log-Source": clean_source(source),
            "Content-Type": "text/plain; charset=utf-8",
        }
        bodies = split_bodies(lines)
        for group in bodies:
            await self._request(
                "log_push", "/api/log-push", stop_s, content=encode_body(group), headers=headers
            )
        return len(bodies)

    # -- plumbing --

    async def _report(
        self,
        call: str,
        path: str,
        payload: dict[str, Any],
        stop_s: float | None,
        require: Mapping[str, type] | None = None,
    ) -> dict[str, Any]:
        if self._http is None:
            self._skipped(call, payload, answer="ok")
            return {"ok": True}
        expected = {"ok": bool, **(require or {})}
        try:
            return await self._post_json(call, path, payload, stop_s, require=expected)
        except ManagerRejected as exc:
            if exc.status == 404:
                raise InstanceGone(call, str(payload.get("uuid")), exc.message) from None
            raise

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
        path: str,
        payload: dict[str, Any],
        stop_s: float | None,
        require: Mapping[str, type] | None = None,
    ) -> dict[str, Any]:
        fields = dict(require or {})
        response = await self._request(
            call, path, stop_s, json=payload, check=lambda r: json_object(r, fields)
        )
        data: dict[str, Any] = response.json()
        return data

    async def _request(
        self,
        call: str,
        path: str,
        stop_s: float | None,
        method: str = "POST",
        check: Callable[[httpx.Response], None] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One call, retried on transient failures under the manager's shared backoff until the
        call's stop (or ``stop_s``); return a 2xx, raise otherwise."""
        assert self._http is not None
        policy = self.retry.policy(call)
        started = time.monotonic()
        budget = policy.stop_s if stop_s is None else min(policy.stop_s, stop_s)
        deadline = started + max(budget, 0.0)
        attempts = 0
        last: BaseException | None = None
        while True:
            now = time.monotonic()
            wait = self.backoff.wait_s(now)
            if wait > 0:
                # Not before the shared backoff (or a Retry-After) says: even a new call waits.
                # Past the call's stop, the stop is used up first: never a busy retry loop.
                await asyncio.sleep(min(wait, max(deadline - now, 0.0)))
                after = time.monotonic()
                if after >= deadline and (attempts or self.backoff.wait_s(after) > 0):
                    break
                continue
            probing = self.backoff.failing
            if probing:
                # The manager is failing: one request at a time finds out whether it is back.
                try:
                    async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                        await self._probe.acquire()
                except TimeoutError:
                    break
                if self.backoff.wait_s(time.monotonic()) > 0:
                    self._probe.release()  # another call's probe failed meanwhile
                    continue
            attempts += 1
            try:
                response = await self._once(method, path, check, stop_s, deadline, kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                last = exc
                retry_after = exc.retry_after_s if isinstance(exc, ServerError) else None
                pause = self.backoff.failed(time.monotonic(), self._rng.random(), retry_after)
                self._away.failed(call, attempts, describe_failure(exc), pause,
                                  retry_after=retry_after is not None)  # fmt: skip
                if time.monotonic() + pause >= deadline:
                    break
                continue
            finally:
                if probing:
                    self._probe.release()
            self.backoff.answered()
            self._away.answered(call)
            if response.status_code >= 400:
                raise ManagerRejected(call, response.status_code, error_message(response))
            if attempts > 1:
                log.info("manager.call_ok", call=call, attempts=attempts)
            return response
        waited_s = time.monotonic() - started
        if last is None:
            reason = "the manager's backoff outlasted this call's stop"
        else:
            reason = describe_failure(last)
        self._away.gave_up(call, attempts, waited_s, reason)
        raise ManagerUnavailable(call, attempts, reason, bad_answer=isinstance(last, BadAnswer))

    async def _once(
        self,
        method: str,
        path: str,
        check: Callable[[httpx.Response], None] | None,
        stop_s: float | None,
        deadline: float,
        kwargs: dict[str, Any],
    ) -> httpx.Response:
        """One request; a transient failure raises (ServerError, BadAnswer, httpx's errors)."""
        assert self._http is not None
        self.requests += 1
        if stop_s is None:
            response = await self._http.request(method, path, **kwargs)
        else:
            # The caller's deadline also cuts the attempt itself, not only the retrying.
            timeout = self.timeouts.as_httpx(deadline - time.monotonic())
            response = await self._http.request(method, path, timeout=timeout, **kwargs)
        status = response.status_code
        if status >= 500 or status in THROTTLED_STATUSES:
            after = parse_retry_after(response.headers.get("Retry-After"), self._wall())
            raise ServerError(status, error_message(response), after)
        if check is not None and status < 300:
            check(response)  # a 2xx that is not the API's answer is retried (BadAnswer)
        return response


def _status_listing(response: httpx.Response) -> None:
    """A ``GET /status`` answer that can be the manager's (see ``instance_record``)."""
    json_list(response)
    problem = listing_problem(response.json())
    if problem is not None:
        raise BadAnswer(response.status_code, problem, response.content)
