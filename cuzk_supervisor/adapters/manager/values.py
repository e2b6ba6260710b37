"""The manager client's values: timeouts, retry policies, errors and answers.

Plain values shared by the client (:mod:`cuzk_supervisor.adapters.manager.client`), the outbox
(:mod:`cuzk_supervisor.adapters.manager.outbox`) and the log shipper; see the client's docstring for
the rules they encode (what is retried, what is final).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cuzk_supervisor.adapters.manager.http import Timeouts, TransportError
from cuzk_supervisor.core.checks import POSITIVE, require_fields, require_relation

__all__ = [
    "BadAnswer",
    "BenchVerdict",
    "HttpRetryPolicy",
    "InstanceGone",
    "ManagerError",
    "ManagerRejected",
    "ManagerRetry",
    "ManagerTimeouts",
    "ManagerUnavailable",
    "Registration",
    "Weather",
    "describe_failure",
    "is_transient",
]


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManagerTimeouts:
    """HTTP timeouts of one request. Short: a slow manager is retried, never waited on."""

    connect_s: float = 3.0
    read_s: float = 10.0
    write_s: float = 10.0

    def __post_init__(self) -> None:
        require_fields(self, (f.name for f in dataclasses.fields(self)), POSITIVE)

    def limits(self, cap_s: float | None = None) -> Timeouts:
        """The transport's timeouts; ``cap_s`` shortens every phase (a caller's deadline)."""

        def cut(value: float) -> float:
            return value if cap_s is None else max(min(value, cap_s), 0.001)

        return Timeouts(cut(self.connect_s), cut(self.write_s), cut(self.read_s))


@dataclass(frozen=True, slots=True)
class ManagerRetry:
    """Backoff and, per kind of call, how long to keep retrying (settings). The backoff is one
    :class:`~cuzk_supervisor.core.backoff.SharedBackoff` per manager, shared by every call: a
    call's stop bounds how long that call keeps trying, never restarts the pauses."""

    backoff_base_s: float = 0.5
    """First wait before a retry (full jitter, doubled at each consecutive failure)."""
    backoff_max_s: float = 120.0
    """Longest wait between two attempts (a ``Retry-After`` may ask for longer). Long enough
    that a fleet of thousands probing a manager that is away stays near its steady request
    rate, and comes back spread over it (docs/architecture.md, rule 7)."""
    retry_after_max_s: float = 600.0
    """Longest ``Retry-After`` honoured (429/503); a longer one is cut to this."""
    register_stop_s: float = 300.0
    """Register: without a uuid nothing else can be reported; the lifecycle decides after."""
    report_stop_s: float = 120.0
    """param-done, bench-done, running: the report stays in the outbox when this runs out."""
    log_stop_s: float = 5.0
    """Log push: short, so a dead manager does not hold the shipper (it keeps the lines)."""
    warn_every_s: float = 60.0
    """While the manager is away, a warning naming its URL at most this often, whatever the
    call (info between): the first failure after an answer is always a warning
    (:mod:`cuzk_supervisor.adapters.manager.away`)."""

    def __post_init__(self) -> None:
        require_fields(self, (f.name for f in dataclasses.fields(self)), POSITIVE)
        require_relation(self, "backoff_max_s", ">=", "backoff_base_s")

    def policy(self, call: str) -> HttpRetryPolicy:
        stops = {"register": self.register_stop_s, "log_push": self.log_stop_s}
        stop = stops.get(call, self.report_stop_s)
        return HttpRetryPolicy(call, self.backoff_base_s, self.backoff_max_s, stop)


# --- errors -------------------------------------------------------------------------------------


class ManagerError(Exception):
    """Base of this module's errors."""


class InstanceGone(ManagerError):
    """The manager's own word that it no longer knows this instance (its JSON 404 on a report,
    :data:`cuzk_supervisor.core.answers.GONE_TEXTS`, or our record in state ``killed``). Final."""

    def __init__(self, call: str, uuid: str, message: str) -> None:
        self.call = call
        self.uuid = uuid
        self.message = message
        super().__init__(f"{call}: instance {uuid} is gone at the manager: {message}")


class ManagerRejected(ManagerError):
    """The manager's JSON 400: our request is wrong; sending it again cannot help. Final."""

    def __init__(self, call: str, status: int, message: str) -> None:
        self.call = call
        self.status = status
        self.message = message
        super().__init__(f"{call}: manager answered {status}: {message}")


class ManagerUnavailable(ManagerError):
    """No word from the manager until the call's retry stop (or the caller's deadline) ran out:
    no answer at all, or only weather. ``weather``: the last attempt got an answer that was not
    the manager's word (a proxy's page, an empty 404, a 5xx), not a refused connection or a
    timeout. ``bad_answer``: that answer says something in front of the manager answers for it,
    not that it is down or busy: a 2xx that is not the API's answer, or a 4xx page other than
    408 and 429 (a 403 on the dashboard's API, say)."""

    def __init__(
        self, call: str, attempts: int, reason: str, *, weather: bool = False,
        bad_answer: bool = False,
    ) -> None:  # fmt: skip
        self.call = call
        self.attempts = attempts
        self.reason = reason
        self.weather = weather or bad_answer
        self.bad_answer = bad_answer
        super().__init__(f"{call}: manager unavailable after {attempts} attempt(s): {reason}")


class Weather(Exception):
    """An answer that is not the manager's word (:mod:`cuzk_supervisor.core.answers`): retried,
    never final. ``described`` names what answered (status, ``Server`` header, the body's first
    line); ``retry_after_s``: its ``Retry-After`` (an HTTP-date read as seconds from now)."""

    def __init__(self, status: int, described: str, retry_after_s: float | None = None) -> None:
        self.status = status
        self.described = described
        self.retry_after_s = retry_after_s
        super().__init__(described)


class BadAnswer(Weather):
    """A 2xx whose body is not the answer the API defines: a proxy's page (a maintenance page is
    a 200 with HTML). Not applied as far as we can tell, so tried again (GET /status reconciles
    an answer that was only mangled)."""

    def __init__(self, status: int, detail: str, body: bytes) -> None:
        super().__init__(status, f"HTTP {status} {detail}: {body[:120]!r}")


def is_transient(exc: BaseException) -> bool:
    """No answer (refused, timed out, dropped), or weather: worth another attempt."""
    return isinstance(exc, TransportError | Weather)


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, Weather):
        return exc.described
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- retry policy -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpRetryPolicy:
    """How one kind of manager call retries: a value to print, compare and test. The pauses
    come from the manager's one shared backoff (``base_s``, ``max_s``); ``stop_s`` bounds how
    long one call keeps trying."""

    name: str
    base_s: float
    max_s: float
    stop_s: float


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
    """False when no manager is configured: nobody judged the rate. ``passed`` is then True for a
    measured rate (the run goes on) and False for the failure report (rate 0)."""
