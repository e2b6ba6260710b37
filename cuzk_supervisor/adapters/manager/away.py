"""Warnings while the manager is away: loud enough to be seen, never a flood.

A person looking at the log must see at once where the supervisor is trying to go (the URL) and
that it is still trying, without a line per retry. One outage is one story, whatever the calls:

- the first failed request after the manager last answered (or since start) is a ``warning``
  that names the URL;
- while it stays away, a failed request is a ``warning`` again at most every
  ``ManagerRetry.warn_every_s`` (60 s), whichever call it is (register, a report, the status
  lookup), and ``info`` between;
- the first answer after that is one ``manager.back`` (info) saying how long it was away.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from tenacity import RetryCallState

from cuzk_supervisor.adapters.manager.values import describe_failure

log = structlog.get_logger("supervisor.manager")

WARN_EVERY_S = 60.0
"""While the manager stays away, a warning naming its URL at most this often (info between)."""


class AwayWarnings:
    """The level of each failure line of one manager, by the cadence in the module docstring."""

    def __init__(
        self,
        url: str | None,
        *,
        every_s: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.url = url
        self.every_s = every_s
        self._clock = clock
        self._away_since: float | None = None
        self._last_loud = -float("inf")
        self.listeners: list[Callable[[str, int, float], None]] = []
        """Told ``(call, attempt, pause_s)`` at each retry (the status line shows the wait)."""

    @property
    def away(self) -> bool:
        """A request failed and none has been answered since."""
        return self._away_since is not None

    def _log(self, event: str, **fields: object) -> None:
        """Log a failure: a warning if the outage just began or the cadence is due, else info."""
        now = self._clock()
        began = self._away_since is None
        if self._away_since is None:
            self._away_since = now
        loud = began or now - self._last_loud >= self.every_s
        if loud:
            self._last_loud = now
        away_s = round(now - self._away_since, 1)
        (log.warning if loud else log.info)(event, url=self.url, away_s=away_s, **fields)

    def retry_logger(self, call: str) -> Callable[[RetryCallState], None]:
        """A tenacity ``before_sleep``: one ``manager.retry`` line per failed attempt."""

        def before_sleep(state: RetryCallState) -> None:
            outcome = state.outcome
            exc = outcome.exception() if outcome is not None else None
            self._log(
                "manager.retry",
                call=call,
                attempt=state.attempt_number,
                reason=describe_failure(exc) if exc is not None else None,
                sleep_s=round(state.upcoming_sleep, 3),
            )
            for listener in self.listeners:
                listener(call, state.attempt_number, state.upcoming_sleep)

        return before_sleep

    def gave_up(self, call: str, attempts: int, waited_s: float, reason: str) -> None:
        """A call ran out of its retry stop (``manager.unavailable``)."""
        self._log(
            "manager.unavailable",
            call=call,
            attempts=attempts,
            waited_s=round(waited_s, 3),
            reason=reason,
        )

    def answered(self, call: str) -> None:
        """The manager answered (any HTTP answer but a 5xx): the outage, if any, is over."""
        if self._away_since is None:
            return
        away_s = round(self._clock() - self._away_since, 1)
        self._away_since = None
        log.info("manager.back", url=self.url, call=call, away_s=away_s)
