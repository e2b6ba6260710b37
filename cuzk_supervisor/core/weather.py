"""Weather at the manager's URL, told as episodes (pure; times and answers are arguments).

An answer that is not the manager's word (:mod:`cuzk_supervisor.core.answers`: a proxy's page,
an empty 404, a 5xx, a 429) is retried, never final. One such answer says little; a proxy that
keeps answering for itself for minutes is something an operator must hear of, once, clearly.
So weather answers are grouped into episodes:

- an episode starts at a weather answer and lasts while weather answers keep coming, however
  many of the manager's own answers come between them (a proxy that fails half the requests
  is one episode, not a hundred);
- it ends once no weather answer came for ``quiet_s``;
- an episode that has lasted ``sustained_s`` (a setting, ``manager_weather_s``, 10 minutes by
  default) is told once (:attr:`Told.kind` ``"sustained"``), and its end once more
  (``"over"``) — whatever the number of answers, at most two lines an episode.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["QUIET_SHARE", "Told", "WeatherEpisodes"]

QUIET_SHARE = 0.5
"""An episode ends after ``sustained_s * QUIET_SHARE`` without a weather answer (at most
:data:`MAX_QUIET_S`)."""
MAX_QUIET_S = 300.0


@dataclass(frozen=True, slots=True)
class Told:
    """What to say of an episode: ``kind`` is ``"sustained"`` or ``"over"``."""

    kind: str
    lasted_s: float
    answers: int
    """Weather answers in the episode so far."""
    by_status: dict[int, int]
    last: str
    """The last weather answer, described (status, Server header, the body's first line)."""


@dataclass(slots=True)
class WeatherEpisodes:
    sustained_s: float
    started: float | None = None
    last_at: float | None = None
    answers: int = 0
    told: bool = False
    last: str = ""
    by_status: Counter[int] = field(default_factory=Counter)
    episodes: int = 0
    total: int = 0
    """Weather answers since start, all episodes together."""

    def __post_init__(self) -> None:
        if not self.sustained_s > 0:
            raise ValueError(f"sustained_s must be > 0, got {self.sustained_s!r}")

    @property
    def quiet_s(self) -> float:
        return min(self.sustained_s * QUIET_SHARE, MAX_QUIET_S)

    @property
    def active(self) -> bool:
        """An episode is going on (whether or not it has lasted long enough to be told)."""
        return self.started is not None

    @property
    def sustained(self) -> bool:
        """The current episode has been told as sustained (and is not over)."""
        return self.started is not None and self.told

    def weather(self, now: float, status: int, described: str) -> Told | None:
        """One weather answer at ``now``; what to say, if anything (the end of an earlier
        episode is said first by :meth:`check`, which this calls)."""
        self.check(now)
        if self.started is None:
            self.started = now
            self.answers = 0
            self.told = False
            self.by_status = Counter()
            self.episodes += 1
        self.last_at = now
        self.answers += 1
        self.total += 1
        self.by_status[status] += 1
        self.last = described
        if not self.told and now - self.started >= self.sustained_s:
            self.told = True
            return self._told("sustained", now)
        return None

    def check(self, now: float) -> Told | None:
        """At ``now`` (any answer, or a tick): the episode is over after ``quiet_s`` without
        weather; said only of an episode that was told as sustained."""
        if self.started is None or self.last_at is None or now - self.last_at < self.quiet_s:
            return None
        told = self._told("over", self.last_at) if self.told else None
        self.started = self.last_at = None
        self.told = False
        return told

    def _told(self, kind: str, until: float) -> Told:
        assert self.started is not None
        return Told(kind, until - self.started, self.answers, dict(self.by_status), self.last)
