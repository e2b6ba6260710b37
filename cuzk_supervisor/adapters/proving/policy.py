"""Every deadline and retry rule of the proving client, as plain values.

:class:`ProvingTimeouts` (``timeouts``) holds the deadlines and budgets; :class:`RetryPolicy`
says what one kind of call retries and how it waits, and builds the tenacity controller for one
series of attempts. The four ``*_policy`` values are to print, compare and test; the client and
the proof loop only run them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from cuzk_supervisor.adapters.proving.errors import (
    CUT_CODES,
    code_of,
    describe,
    is_connect_failure,
    is_own_cancel,
)
from cuzk_supervisor.adapters.proving.timeouts import MIN_READY_POLL_INTERVAL_S, ProvingTimeouts

log = structlog.get_logger("supervisor.proving")

_CUT_OR_UNAVAILABLE = CUT_CODES | {grpc.StatusCode.UNAVAILABLE}


@dataclass(slots=True)
class Attempt:
    """When the current attempt started and its deadline (read by the backoff)."""

    started: float = 0.0
    deadline_s: float = 0.0

    def begin(self, deadline_s: float) -> None:
        self.started, self.deadline_s = time.monotonic(), deadline_s

    def waited_out(self) -> bool:
        """The attempt lasted at least half its deadline: a cut, not a quick refusal."""
        return time.monotonic() - self.started >= self.deadline_s / 2


class _PolicyWait(wait_base):
    """Full-jitter exponential backoff, except no wait after a deadline cut a call."""

    def __init__(self, policy: RetryPolicy, attempt: Attempt | None = None) -> None:
        self._immediate = policy.immediate
        self._attempt = attempt
        self._backoff = wait_random_exponential(
            multiplier=policy.base_s, max=policy.max_s, min=policy.min_s
        )

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        # Only a real cut (the call already waited its length) skips the backoff; a server
        # answering TIMEOUT or CANCELLED at once must not make us spin.
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in self._immediate:
            ours = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if ours or self._attempt is None or self._attempt.waited_out():
                return 0.0
        return float(self._backoff(retry_state))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What one kind of call retries and how it waits: a value to print, compare and test. Only
    the listed status codes are retried; everything else ends the retrying at once."""

    name: str
    codes: frozenset[grpc.StatusCode]
    """Status codes known to be transient for this call."""
    base_s: float
    """Backoff scale: the n-th wait is uniform in [min_s, min(max_s, base_s * 2**(n-1))]."""
    max_s: float
    """Backoff cap."""
    min_s: float = 0.0
    """Least wait between two tries (rate-limits GetStatus)."""
    before_send_only: bool = False
    """Retry UNAVAILABLE only when the channel could not connect (nothing was sent)."""
    immediate: frozenset[grpc.StatusCode] = frozenset()
    """Codes retried without backoff: a deadline cut the call, which already waited (a
    CANCELLED that came before half the call's deadline backs off like any error). The
    backoff's attempt counter still counts them, so a later transport error waits up to
    ``max_s``."""
    max_attempts: int | None = None
    """Stop after this many attempts (None: only the budget stops)."""
    unknown_fate: frozenset[grpc.StatusCode] = frozenset()
    """Codes after which the call may or may not have reached the daemon (UNAVAILABLE only when
    the channel had connected): not retried, resolved by the caller (submit: await first)."""

    def is_transient(self, exc: BaseException) -> bool:
        code = code_of(exc)
        if code is None or code not in self.codes or is_own_cancel(exc):
            return False
        if self.before_send_only and code == grpc.StatusCode.UNAVAILABLE:
            return is_connect_failure(exc)
        return True

    def fate_unknown(self, exc: BaseException) -> bool:
        code = code_of(exc)
        if code is None or code not in self.unknown_fate or is_own_cancel(exc):
            return False
        return code != grpc.StatusCode.UNAVAILABLE or not is_connect_failure(exc)

    def retrying(
        self,
        budget_s: float,
        before_sleep: Callable[[RetryCallState], None],
        attempt: Attempt | None = None,
    ) -> AsyncRetrying:
        """A tenacity controller for one series of attempts that must end within ``budget_s``
        (``attempt``, when given, tells the backoff how long the last attempt waited)."""
        stop: stop_base = stop_before_delay(max(budget_s, 0.0))
        if self.max_attempts is not None:
            stop = stop | stop_after_attempt(self.max_attempts)
        return AsyncRetrying(
            retry=retry_if_exception(self.is_transient),
            wait=_PolicyWait(self, attempt),
            stop=stop,
            before_sleep=before_sleep,
            reraise=True,
        )


def submit_policy(t: ProvingTimeouts) -> RetryPolicy:
    """SubmitProof: retried only when nothing was sent (connection refused, no socket). A cut
    (our deadline or the server's CANCELLED) or UNAVAILABLE from a connection dropped
    mid-upload leaves us not knowing whether the job landed (``unknown_fate``): not retried
    here but resolved by awaiting the job (NOT_FOUND = not submitted). Risk, noted on purpose:
    a submit still being processed by the server when that await arrives could be proven
    twice; the window is the server's enqueue time.
    """
    return RetryPolicy(
        name="submit",
        codes=frozenset({grpc.StatusCode.UNAVAILABLE}),
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        before_send_only=True,
        unknown_fate=_CUT_OR_UNAVAILABLE,
    )


def await_policy(t: ProvingTimeouts) -> RetryPolicy:
    """AwaitProof: a cut (our deadline or the server's CANCELLED) or a transport error means
    "await the same job again"."""
    return RetryPolicy(
        name="await",
        codes=_CUT_OR_UNAVAILABLE,
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        immediate=CUT_CODES,
    )


def ready_policy(t: ProvingTimeouts) -> RetryPolicy:
    """GetStatus while starting: not listening yet, or cut (too slow to answer, by our deadline
    or the server's); never too often."""
    return RetryPolicy(
        name="ready",
        codes=_CUT_OR_UNAVAILABLE,
        base_s=t.ready_poll_interval_s,
        max_s=t.ready_poll_max_s,
        min_s=t.ready_poll_interval_s,
    )


def call_policy(t: ProvingTimeouts) -> RetryPolicy:
    """GetStatus (a liveness probe) and GetMetrics after start: a call the *server* cut
    (CANCELLED) gets one more try within the caller's budget; our own deadline passing means
    the budget is spent, and anything else is the answer."""
    return RetryPolicy(
        name="call",
        codes=frozenset({grpc.StatusCode.CANCELLED}),
        base_s=MIN_READY_POLL_INTERVAL_S,
        max_s=MIN_READY_POLL_INTERVAL_S,
        min_s=MIN_READY_POLL_INTERVAL_S,
        max_attempts=2,
    )


def log_retry(event: str, **context: Any) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        code = code_of(exc) if exc is not None else None
        log.info(event, attempt=state.attempt_number, code=code.name if code is not None else None,
                 reason=describe(exc) if exc is not None else None,
                 sleep_s=round(state.upcoming_sleep, 3), **context)  # fmt: skip

    return before_sleep
