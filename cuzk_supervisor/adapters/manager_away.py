"""Warnings while the manager is away: loud enough to be seen, never a flood.

A person looking at the log must see at once where the supervisor is trying to go (the URL) and
that it is still trying, without a line per retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from tenacity import RetryCallState

from cuzk_supervisor.adapters.manager_types import describe_failure

log = structlog.get_logger("supervisor.manager")

WARN_EVERY_S = 60.0
"""While the manager stays away, a warning naming its URL at most this often (info between)."""


class AwayWarnings:
    """The first failed attempt of a call is a warning that names the URL, then one a minute:
    a person sees at once where the supervisor is trying to go, without a flood of lines."""

    def __init__(self, url: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._clock = clock
        self._last = -float("inf")
        self.listeners: list[Callable[[str, int, float], None]] = []
        """Told ``(call, attempt, pause_s)`` at each retry (the status line shows the wait)."""

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
                reason=describe_failure(exc) if exc is not None else None,
                sleep_s=round(state.upcoming_sleep, 3),
            )
            for listener in self.listeners:
                listener(call, state.attempt_number, state.upcoming_sleep)

        return before_sleep
