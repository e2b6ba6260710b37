"""Client of the fleet manager (reference/manager-api.md) and the durable outbox of reports.

Rules (DESIGN.md principles 5 and 6, incidents I2 and I5):

- Every call is bounded: short HTTP timeouts (:class:`ManagerTimeouts`) and, per call, a retry
  stop (:class:`ManagerRetry`). Only what is known to be transient is retried: connection
  errors, timeouts, a dropped connection, and 5xx. A 4xx is an answer, never retried.
- A 404 on ``/param-done``, ``/bench-done`` or ``/running`` means the manager no longer knows a
  live instance (killed, destroyed): :class:`InstanceGone`, this instance is finished.
  ``passed: false`` from ``/bench-done`` is a value, ``BenchVerdict(passed=False)``.
- No manager configured (``base_url=None``) is a local run: each report is logged as
  ``manager.report_skipped`` and answered with a synthetic success.
- Reports other than register go through the :class:`Outbox`, stored in the state file: a
  report is written to disk before it is sent, and removed only after the manager acknowledged
  it. A crash in between leaves it queued: delivery is at least once. That is safe with the
  real manager: ``/param-done`` and ``/running`` are idempotent, and ``/bench-done`` applied
  twice with the same rate gives the same verdict. Still, a report found queued at start is
  first looked up in the manager's ``GET /status`` (:mod:`cuzk_supervisor.core.reconcile`), because
  a
  ``/bench-done`` sent again would revive an instance the manager killed meanwhile; only what
  the manager has not recorded is sent again. A report is removed right after its first 2xx,
  so it is sent at most once per acknowledgement.

Retrying a POST whose answer was lost (a read timeout) may apply it twice for the same reasons
above; that is why read timeouts are retried too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import httpx
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_random_exponential,
)

from cuzk_supervisor.adapters.state import (
    BENCH_DONE,
    OUTCOME_GONE,
    OUTCOME_OK,
    OUTCOME_REJECTED,
    PARAM_DONE,
    RUNNING,
    Report,
    StateKeeper,
    utc_now_iso,
)
from cuzk_supervisor.core.reconcile import (
    RECONCILED_KINDS,
    Recorded,
    find_record,
    recorded_outcome,
)

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

MAX_BODY_BYTES = 256 * 1024
"""The manager reads only the first 256 KiB of a log-push body and silently drops the rest."""
TRUNCATED_MARK = " …[truncated {n} bytes]"


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManagerTimeouts:
    """HTTP timeouts of one request. Short: a slow manager is retried, never waited on."""

    connect_s: float = 3.0
    read_s: float = 10.0
    write_s: float = 10.0
    pool_s: float = 3.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"{f.name} must be > 0, got {value!r}")

    def as_httpx(self, cap_s: float | None = None) -> httpx.Timeout:
        """As an ``httpx.Timeout``; ``cap_s`` shortens every phase (a caller's deadline)."""

        def cut(value: float) -> float:
            return value if cap_s is None else max(min(value, cap_s), 0.001)

        return httpx.Timeout(
            connect=cut(self.connect_s),
            read=cut(self.read_s),
            write=cut(self.write_s),
            pool=cut(self.pool_s),
        )


@dataclass(frozen=True, slots=True)
class ManagerRetry:
    """Backoff and, per kind of call, how long to keep retrying (settings)."""

    backoff_base_s: float = 0.5
    """First wait before a retry (full jitter, doubled each attempt)."""
    backoff_max_s: float = 15.0
    """Longest wait between two attempts."""
    register_stop_s: float = 300.0
    """Register: without a uuid nothing else can be reported; the lifecycle decides after."""
    report_stop_s: float = 120.0
    """param-done, bench-done, running: the report stays in the outbox when this runs out."""
    log_stop_s: float = 5.0
    """Log push: short, so a dead manager does not hold the shipper (it keeps the lines)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"{f.name} must be > 0, got {value!r}")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")

    def policy(self, call: str) -> HttpRetryPolicy:
        stop = {
            "register": self.register_stop_s,
            "log_push": self.log_stop_s,
        }.get(call, self.report_stop_s)
        return HttpRetryPolicy(call, self.backoff_base_s, self.backoff_max_s, stop)


# --- errors -------------------------------------------------------------------------------------


class ManagerError(Exception):
    """Base of this module's errors."""


class InstanceGone(ManagerError):
    """404: the manager has no live instance with this uuid (killed or destroyed). Final."""

    def __init__(self, call: str, uuid: str, message: str) -> None:
        self.call = call
        self.uuid = uuid
        self.message = message
        super().__init__(f"{call}: instance {uuid} is gone at the manager: {message}")


class ManagerRejected(ManagerError):
    """A 4xx answer (other than a report's 404): our request is wrong; retrying cannot help."""

    def __init__(self, call: str, status: int, message: str) -> None:
        self.call = call
        self.status = status
        self.message = message
        super().__init__(f"{call}: manager answered {status}: {message}")


class ManagerUnavailable(ManagerError):
    """Transient failures until the call's retry stop (or the caller's deadline) ran out."""

    def __init__(self, call: str, attempts: int, reason: str) -> None:
        self.call = call
        self.attempts = attempts
        self.reason = reason
        super().__init__(f"{call}: manager unavailable after {attempts} attempt(s): {reason}")


class _ServerError(Exception):
    """A 5xx answer: transient by rule."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}")


class _BadAnswer(Exception):
    """A 2xx whose body is not the answer the API defines: a proxy's page (a maintenance page
    is a 200 with HTML), not the manager's word. Transient: the report is not applied as far as
    we can tell, so it is tried again (GET /status reconciles an answer that was only mangled)."""

    def __init__(self, status: int, detail: str, body: bytes) -> None:
        self.status = status
        super().__init__(f"HTTP {status} {detail}: {body[:120]!r}")


# Transient by nature: nothing was answered. (Not UnsupportedProtocol, LocalProtocolError, or
# ProxyError: those are configuration or programming errors.)
_TRANSIENT_HTTPX = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def is_transient(exc: BaseException) -> bool:
    """Connection errors, timeouts, a dropped connection and 5xx: worth another attempt."""
    return isinstance(exc, (*_TRANSIENT_HTTPX, _ServerError, _BadAnswer))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _ServerError | _BadAnswer):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- retry policy -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpRetryPolicy:
    """How one kind of manager call retries: a value to print, compare and test."""

    name: str
    base_s: float
    max_s: float
    stop_s: float

    def retrying(
        self, budget_s: float | None, before_sleep: Callable[[RetryCallState], None]
    ) -> AsyncRetrying:
        """A tenacity controller; it stops at ``stop_s`` or the caller's ``budget_s``."""
        stop = self.stop_s if budget_s is None else min(self.stop_s, budget_s)
        return AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_random_exponential(multiplier=self.base_s, max=self.max_s),
            stop=stop_before_delay(max(stop, 0.0)),
            before_sleep=before_sleep,
            reraise=True,
        )


WARN_EVERY_S = 60.0
"""While the manager stays away, a warning naming its URL at most this often (info between)."""


class _AwayWarnings:
    """The first failed attempt of a call is a warning that names the URL, then one a minute:
    a person sees at once where the supervisor is trying to go, without a flood of lines."""

    def __init__(self, url: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._clock = clock
        self._last = -float("inf")

    def retry_logger(self, call: str) -> Callable[[RetryCallState], None]:
        def before_sleep(state: RetryCallState) -> None:
            outcome = state.outcome
            exc = outcome.exception() if outcome is not None else None
            now = self._clock()
            loud = state.attempt_number == 1 or now - self._last >= WARN_EVERY_S
            if loud:
                self._last = now
            (log.warning if loud else log.info)(
                "manager.retry",
                call=call,
                url=self.url,
                attempt=state.attempt_number,
                reason=_describe(exc) if exc is not None else None,
                sleep_s=round(state.upcoming_sleep, 3),
            )

        return before_sleep


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registration:
    uuid: str
    runner_id: int
    local: bool = False
    """True when no manager is configured (synthetic answer)."""


@dataclass(frozen=True, slots=True)
class BenchVerdict:
    passed: bool
    rate: float
    checked: bool = True
    """False when no manager is configured: ``passed`` is assumed, not computed."""


# --- log push wire format (pure) ----------------------------------------------------------------


def normalize_line(line: str, max_bytes: int = MAX_BODY_BYTES - 1) -> tuple[str, int]:
    """One log line as the manager will store it, and its size in a body (newline included).

    Trailing line breaks go; inner ones become a visible ``\\n`` (the manager splits bodies on
    newlines). A line over ``max_bytes`` UTF-8 bytes is cut, on a character boundary, and ends
    with a marker saying how much was cut. The result is empty for an empty line (the manager
    drops those anyway).
    """
    text = line.rstrip("\r\n")
    if "\n" in text or "\r" in text:
        text = text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text, len(data) + 1 if data else 0
    # Marker length depends on the number it shows; use the widest it can need.
    mark_room = len(TRUNCATED_MARK.format(n=len(data)).encode())
    keep = max(max_bytes - mark_room, 0)
    head = data[:keep].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode())
    text = head + TRUNCATED_MARK.format(n=cut)
    return text, len(text.encode()) + 1


def encode_body(lines: Iterable[str]) -> bytes:
    """A log-push body: lines joined with ``\\n``, one after the last."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "replace")


def split_bodies(lines: Iterable[str], max_body_bytes: int = MAX_BODY_BYTES) -> list[list[str]]:
    """Normalise ``lines`` and pack them, in order, into groups whose body fits the limit."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for raw in lines:
        text, n = normalize_line(raw, max_body_bytes - 1)
        if not n:
            continue
        if current and size + n > max_body_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(text)
        size += n
    if current:
        groups.append(current)
    return groups


def clean_source(source: str) -> str:
    """A header-safe log source name (the manager shows unknown names under "all")."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in source)
    return cleaned[:64] or "unknown"


# --- the client ---------------------------------------------------------------------------------


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return error
    text = response.text.strip()
    return text[:200] if text else response.reason_phrase


def _json_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _BadAnswer(response.status_code, "not JSON", response.content) from None


def _json_object(response: httpx.Response, require: Mapping[str, type]) -> None:
    """The body is a JSON object with each required field of its type (bool is not an int)."""
    data = _json_body(response)
    if not isinstance(data, dict):
        raise _BadAnswer(response.status_code, "not a JSON object", response.content)
    if "ok" in require and data.get("ok") is not True:
        # param-done, running and bench-done answer {"ok": true, ...}; anything else (a proxy's
        # own JSON, {"ok": false}) is not the manager applying the report.
        raise _BadAnswer(response.status_code, "no ok: true", response.content)
    for name, kind in require.items():
        value = data.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _BadAnswer(response.status_code, f"no {kind.__name__} {name}", response.content)
        if kind is str and not value:
            raise _BadAnswer(response.status_code, f"empty {name}", response.content)


def _json_list(response: httpx.Response) -> None:
    if not isinstance(_json_body(response), list):
        raise _BadAnswer(response.status_code, "not a JSON list", response.content)


class ManagerClient:
    """Async client of the manager. Use as ``async with ManagerClient(url) as client``.

    ``base_url=None`` is a local run (no manager): reports are logged and answered locally.
    ``transport`` replaces the network (tests use ``httpx.MockTransport``).
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        timeouts: ManagerTimeouts | None = None,
        retry: ManagerRetry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"manager URL must start with http:// or https://, got {base_url!r}")
        self.timeouts = timeouts if timeouts is not None else ManagerTimeouts()
        self.retry = retry if retry is not None else ManagerRetry()
        self._http: httpx.AsyncClient | None = None
        self._away = _AwayWarnings(self.base_url)
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
            log.info("manager.report_skipped", call="register", payload=payload, answer="local")
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
            log.info(
                "manager.report_skipped",
                call=BENCH_DONE,
                payload=payload,
                passed=True,
                note="no manager configured: the rate was not checked, assumed passed",
            )
            return BenchVerdict(passed=True, rate=rate, checked=False)
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
        """This instance's record in ``GET /status`` (None: not listed, or no manager)."""
        if self._http is None:
            return None
        response = await self._request("status", "/status", stop_s, method="GET", check=_json_list)
        return find_record(response.json(), uuid)

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
            log.info("manager.report_skipped", call=call, payload=payload, answer="ok")
            return {"ok": True}
        expected = {"ok": bool, **(require or {})}
        try:
            return await self._post_json(call, path, payload, stop_s, require=expected)
        except ManagerRejected as exc:
            if exc.status == 404:
                raise InstanceGone(call, str(payload.get("uuid")), exc.message) from None
            raise

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
            call, path, stop_s, json=payload, check=lambda r: _json_object(r, fields)
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
        """One call with retries on transient failures; return a 2xx, raise otherwise."""
        assert self._http is not None
        http = self._http
        policy = self.retry.policy(call)
        started = time.monotonic()
        attempts = 0

        async def once() -> httpx.Response:
            nonlocal attempts
            attempts += 1
            if stop_s is None:
                response = await http.request(method, path, **kwargs)
            else:
                # The caller's deadline also cuts the attempt itself, not only the retrying.
                left = stop_s - (time.monotonic() - started)
                timeout = self.timeouts.as_httpx(left)
                response = await http.request(method, path, timeout=timeout, **kwargs)
            if response.status_code >= 500:
                raise _ServerError(response.status_code, _error_message(response))
            if check is not None and response.status_code < 300:
                check(response)  # a 2xx that is not the API's answer is retried (_BadAnswer)
            return response

        try:
            response: httpx.Response = await policy.retrying(stop_s, self._away.retry_logger(call))(
                once
            )
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning(
                "manager.unavailable",
                call=call,
                url=self.base_url,
                attempts=attempts,
                waited_s=round(time.monotonic() - started, 3),
                reason=_describe(exc),
            )
            raise ManagerUnavailable(call, attempts, _describe(exc)) from exc
        if response.status_code >= 400:
            raise ManagerRejected(call, response.status_code, _error_message(response))
        if attempts > 1:
            log.info("manager.call_ok", call=call, attempts=attempts)
        return response


# --- the outbox ---------------------------------------------------------------------------------

SaveOutbox = Callable[[tuple[Report, ...], tuple[Report, ...]], Awaitable[None]]
"""Persists ``(pending, acked)`` in the state file; must raise if it could not (then nothing is
sent). :meth:`cuzk_supervisor.adapters.state.StateKeeper.save_outbox` is one."""


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
    acknowledgement, or after an answer that retrying cannot change (404: the instance is gone;
    another 4xx: rejected); it then joins ``acked``, the last ``keep_acked`` finished reports,
    kept in the state file too so that a verdict acknowledged just before a crash is not lost.
    """

    def __init__(
        self,
        client: ManagerClient,
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
        # Reports loaded from the state file are on disk already.
        self._durable: set[str] = {r.id for r in self._pending}
        # ... and may have been applied by the manager just before the crash that left them
        # queued: looked up in its records before they are sent again
        # (cuzk_supervisor.core.reconcile).
        self._unverified: set[str] = {r.id for r in self._pending if r.kind in RECONCILED_KINDS}
        # Everything finished by this process, even once pruned from ``acked`` (a handful).
        self._finished: dict[str, Report] = {r.id: r for r in self._acked}
        self._send_lock = asyncio.Lock()

    @classmethod
    def for_keeper(cls, client: ManagerClient, keeper: StateKeeper) -> Outbox:
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
        """Queue ``report`` and write the state file; only then may it be sent.

        Idempotent by id. Raises what the save raises (StateWriteError); the report is then not
        queued.
        """
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

        For bench_done, ``.passed`` is the verdict. Raises InstanceGone (404),
        ManagerRejected (another 4xx), ManagerUnavailable (the manager stayed away until the
        retry stop or ``deadline_s``: the report stays queued, durable, for a later
        ``send_now`` with the same report or a ``drain``), or StateWriteError.
        A report already finished (e.g. acknowledged before a crash) is not sent again: its
        recorded outcome is returned (or raised).
        """
        await self.enqueue(report)
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        async with self._send_lock:
            while True:
                done = self.find(report.id)
                if done is not None and not done.pending:
                    return _raise_for(done)
                head = self._pending[0]
                await self._deliver(head, _remaining(deadline))

    async def drain(self, deadline_s: float | None = None) -> DrainResult:
        """Send queued reports in order until none is left, the manager is away, or
        ``deadline_s`` passes. Errors are returned, not raised (except StateWriteError)."""
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        sent: list[Report] = []
        error: ManagerError | None = None
        async with self._send_lock:
            while self._pending:
                head = self._pending[0]
                if head.id not in self._durable:
                    break  # still being written by its enqueue: its sender will send it
                try:
                    sent.append(await self._deliver(head, _remaining(deadline)))
                except ManagerUnavailable as exc:
                    error = exc
                    break
        return DrainResult(tuple(sent), len(self._pending), error)

    async def _deliver(self, report: Report, budget_s: float | None) -> Report:
        """Send the head report; record how it ended. ManagerUnavailable leaves it queued."""
        if budget_s is not None and budget_s <= 0:
            raise ManagerUnavailable(report.kind, 0, "deadline passed before sending")
        started = time.monotonic()
        try:
            done = await self._recorded(report, budget_s)
            if done is None:
                left = None if budget_s is None else budget_s - (time.monotonic() - started)
                done = await self.client.send(report, stop_s=left)
        except InstanceGone as exc:
            done = _finished(report, OUTCOME_GONE, exc.message)
            log.warning("manager.report_gone", kind=report.kind, id=report.id, detail=exc.message)
        except ManagerRejected as exc:
            done = _finished(report, OUTCOME_REJECTED, f"{exc.status} {exc.message}")
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
        except ManagerRejected as exc:
            # A manager without a usable /status: at-least-once delivery, which is safe.
            log.warning(
                "manager.reconcile_skipped", kind=report.kind, id=report.id, reason=str(exc)
            )
            record = None
        self._unverified.discard(report.id)
        found = recorded_outcome(report, record)
        done = None if found is None else _reconciled(report, found)
        if done is not None:
            log.info(
                "manager.report_reconciled",
                kind=report.kind,
                id=report.id,
                outcome=done.outcome,
                passed=done.passed,
                detail=done.detail,
            )
        return done

    async def _persist(self) -> None:
        await self._save(tuple(self._pending), tuple(self._acked))


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _finished(report: Report, outcome: str, detail: str) -> Report:
    return dataclasses.replace(report, outcome=outcome, detail=detail, finished_at=utc_now_iso())


def _reconciled(report: Report, found: Recorded) -> Report:
    """``report`` finished as the manager's records show (:func:`recorded_outcome`)."""
    return dataclasses.replace(
        report,
        outcome=found.outcome,
        passed=found.passed,
        detail=found.detail,
        finished_at=utc_now_iso(),
    )


def _raise_for(report: Report) -> Report:
    if report.outcome == OUTCOME_GONE:
        raise InstanceGone(report.kind, report.uuid, report.detail)
    if report.outcome == OUTCOME_REJECTED:
        status, _, message = report.detail.partition(" ")
        raise ManagerRejected(report.kind, int(status) if status.isdigit() else 0, message)
    return report
