"""Failed requests to the manager: counted, and told in a few lines, never one per retry.

A person looking at the log must see at once where the supervisor is trying to go (the URL) and
that it is still trying, without a line per retry; and the manager must not receive, once it is
back, a backlog made of our own retry lines (every line is shipped to it). One outage is one
story, whatever the calls:

- the first failed request after the manager last answered (or since start) is one
  ``manager.away`` warning naming the URL, the call and why — at once, unless a line was said
  less than ``ManagerRetry.warn_every_s`` (60 s) ago (a flapping proxy: told at that cadence);
- while it stays away, failures are only counted (:class:`FailureCounts`: by call and by
  reason), and one ``manager.still_away`` warning at most every ``warn_every_s`` sums them up;
- a call that ran out of its retry stop is counted too (``gave_up``), not logged above debug;
- the first answer after a told outage is one ``manager.back`` (info): how long, how many failed.

Each line names what answered (an answer that is not the manager's word: its status, ``Server``
header and first line of text). Weather that lasts (:class:`WeatherLines`) is told once more.
The counts last the client's life (the fleet benchmark and the metrics read them); listeners
hear of every failed attempt (``(call, attempt, pause_s)``: the status line's register wait).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from cuzk_supervisor.core.weather import Told, WeatherEpisodes

log = structlog.get_logger("supervisor.manager")

WARN_EVERY_S = 60.0
"""While the manager stays away, a summary warning at most this often."""


@dataclass(slots=True)
class FailureCounts:
    """Failed requests to one manager, for the life of its client."""

    failed: int = 0
    """Failed attempts (each one retried, unless its call gave up)."""
    by_call: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    """By kind: ``HTTP 503``, ``HTTP 429``, ``ConnectError``, ``bad answer`` ..."""
    gave_up: int = 0
    """Calls that ran out of their retry stop (their work is kept and tried later)."""
    retry_after: int = 0
    """Failures that carried a ``Retry-After`` (honoured)."""
    outages: int = 0


def reason_kind(reason: str) -> str:
    """The kind of a failure, for counting: ``HTTP 503``, ``ConnectError``, ``bad answer``."""
    if reason.startswith("HTTP "):
        head = reason.split(":", 1)[0]
        status = head.split()[1] if len(head.split()) > 1 else ""
        return f"HTTP {status}" if status.isdigit() and not status.startswith("2") else "bad answer"
    return reason.split(":", 1)[0]


class AwayWarnings:
    """Counts the failures of one manager and says, by the cadence above, that it is away."""

    def __init__(
        self, url: str | None, *, every_s: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.url = url
        self.every_s = every_s
        self._clock = clock
        self._away_since: float | None = None
        self._last_line = -float("inf")
        self._since_line: Counter[str] = Counter()
        """Failed attempts, by call, since the last line said."""
        self._outage_failed = 0
        self._told = False  # the current outage was told (manager.away)
        self.counts = FailureCounts()
        self.listeners: list[Callable[[str, int, float], None]] = []
        """Told ``(call, attempt, pause_s)`` at each failed attempt."""

    @property
    def away(self) -> bool:
        """A request failed and none has been answered since."""
        return self._away_since is not None

    def failed(
        self, call: str, attempt: int, reason: str, pause_s: float, *, retry_after: bool = False
    ) -> None:
        """One failed attempt of ``call``; the next request waits ``pause_s``."""
        now = self._clock()
        counts = self.counts
        counts.failed += 1
        counts.by_call[call] += 1
        counts.by_reason[reason_kind(reason)] += 1
        counts.retry_after += int(retry_after)
        self._since_line[call] += 1
        self._outage_failed += 1
        began = self._away_since is None
        if self._away_since is None:
            self._away_since = now
            self._outage_failed = 1
            counts.outages += 1
        away_since = self._away_since
        if now - self._last_line >= self.every_s:
            # The first failure of an outage is told at once, unless a line was said less than
            # a minute ago (a flapping proxy): then it is counted and told at the cadence.
            self._last_line = now
            failed = sum(self._since_line.values())
            if began or not self._told:
                log.warning("manager.away", url=self.url, call=call, reason=reason,
                            failed=failed, next_try_s=round(pause_s, 1))  # fmt: skip
            else:
                log.warning(
                    "manager.still_away", url=self.url, away_s=round(now - away_since, 1),
                    failed=failed, by_call=dict(self._since_line), reason=reason,
                    next_try_s=round(pause_s, 1),
                )  # fmt: skip
            self._told = True
            self._since_line.clear()
        else:
            log.debug("manager.retry", call=call, attempt=attempt, reason=reason,
                      sleep_s=round(pause_s, 3))  # fmt: skip
        for listener in self.listeners:
            listener(call, attempt, pause_s)

    def gave_up(self, call: str, attempts: int, waited_s: float, reason: str) -> None:
        """A call ran out of its retry stop: counted (its caller keeps the work for later)."""
        self.counts.gave_up += 1
        log.debug("manager.unavailable", call=call, attempts=attempts,
                  waited_s=round(waited_s, 3), reason=reason)  # fmt: skip

    def answered(self, call: str) -> None:
        """The manager answered (any HTTP answer that is its own): the outage, if any, is over."""
        if self._away_since is None:
            return
        away_s = round(self._clock() - self._away_since, 1)
        self._away_since = None
        failed, self._outage_failed = self._outage_failed, 0
        told, self._told = self._told, False
        # Said only of an outage that was told; a short one between two lines is only counted.
        (log.info if told else log.debug)(
            "manager.back", url=self.url, call=call, away_s=away_s, failed=failed
        )


class WeatherLines:
    """Weather answers grouped into episodes (``core.weather.WeatherEpisodes``): a sustained
    one is one ``manager.weather`` warning (the ``setup`` tab, the terminal view), its end one
    ``manager.weather_over`` line; listeners hear ``(sustained, last answer)`` (``/metrics``)."""

    def __init__(
        self, url: str | None, sustained_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self.episodes = WeatherEpisodes(sustained_s)
        self._clock = clock
        self.listeners: list[Callable[[bool, str], None]] = []

    def seen(self, status: int, described: str) -> None:
        self._say(self.episodes.weather(self._clock(), status, described))

    def check(self) -> None:
        """Any answer of the manager's own (or a tick): an episode long quiet is over."""
        self._say(self.episodes.check(self._clock()))

    def _say(self, told: Told | None) -> None:
        if told is None:
            return
        minutes = round(told.lasted_s / 60, 1)
        if told.kind == "sustained":
            log.warning(
                "manager.weather", url=self.url, minutes=minutes, answers=told.answers,
                by_status=told.by_status, last=told.last,
                detail=f"for {minutes} min the manager's URL has answered with pages that are "
                "not the manager's (a proxy in front of it?); nothing is ended by them: reports "
                "stay queued and are retried",
            )  # fmt: skip
        else:
            log.info("manager.weather_over", url=self.url, minutes=minutes,
                     answers=told.answers, last=told.last)  # fmt: skip
        for listener in self.listeners:
            listener(told.kind == "sustained", told.last)
