"""The lifecycle's own retry policies, as values (tenacity does the retrying).

Tried again by the lifecycle itself, above the clients' own retries:

- ``/register``: until it answers (without a uuid nothing else can be reported); each call
  already retries with backoff inside the manager client, so the next starts at once.
- a report the lifecycle waits on (``/bench-done``, ``/running``): until the manager answers;
  each send retries inside the outbox for ``manager_retry_s``.
- one proof (warmup, settle): up to 3 attempts when the daemon answers FAILED or the budget runs
  out. A daemon restart under the proof is not an attempt (the proof runner submits it again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    after_nothing,
    stop_after_attempt,
    stop_never,
    wait_fixed,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how fast one kind of thing is tried again: print it, compare it."""

    name: str
    attempts: int | None = None  # None: until it succeeds
    pause_s: float = 0.0

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"{self.name}: attempts must be >= 1 or None, got {self.attempts}")
        if not self.pause_s >= 0:
            raise ValueError(f"{self.name}: pause_s must be >= 0, got {self.pause_s!r}")

    def controller(
        self,
        retry: retry_base,
        *,
        before_sleep: Callable[[RetryCallState], None] | None = None,
        after: Callable[[RetryCallState], None] = after_nothing,
        retry_error_callback: Callable[[RetryCallState], Any] | None = None,
    ) -> AsyncRetrying:
        """A tenacity controller retrying what ``retry`` says, under this policy."""
        stop: stop_base = stop_never if self.attempts is None else stop_after_attempt(self.attempts)
        return AsyncRetrying(
            retry=retry,
            stop=stop,
            wait=wait_fixed(self.pause_s),
            before_sleep=before_sleep,
            after=after,
            retry_error_callback=retry_error_callback,
            reraise=True,
        )


@dataclass(frozen=True, slots=True)
class LifecycleRetries:
    register: Retry = Retry("register")
    report: Retry = Retry("report")
    proof: Retry = Retry("proof", attempts=3)
