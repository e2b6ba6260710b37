"""One backoff per manager, shared by every call, and the ``Retry-After`` it honours (pure).

docs/architecture.md, rule 7 ("Fleet manners"): the whole fleet talks to one manager. A backoff that
restarts at every call brings most of the fleet back within the same few seconds after an
outage and keeps it bunched; so the supervisor keeps ONE :class:`SharedBackoff` per manager:

- every failed attempt, whatever the call (register, a report, a log push, the status read),
  counts one more consecutive failure; the pause before the next attempt of ANY call is a full
  jitter draw, ``u * min(max_s, base_s * 2 ** (failures - 1))``;
- an answer resets the count (the manager is back), but not a ``Retry-After`` already given;
- a ``Retry-After`` (seconds or an HTTP-date, on a 429 or a 503) is a floor: no request goes
  before it, and the pause is spread over ``[after, after * (1 + RETRY_AFTER_SPREAD)]`` so a fleet
  told the same 30 s does not come back in the same second. A value past ``max_after_s`` is
  cut to it (a proxy that says "come back tomorrow" is not taken at its word).

The random draws are arguments (``u`` in ``[0, 1)``), the times too: the caller owns the clock
and the random source, so tests are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["RETRY_AFTER_SPREAD", "SharedBackoff", "full_jitter_s", "parse_retry_after"]

RETRY_AFTER_SPREAD = 0.2
"""A pause for a ``Retry-After`` of ``a`` seconds is drawn in ``[a, a * 1.2]``."""

_MONTHS = {name: index for index, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
)}  # fmt: skip


def full_jitter_s(failures: int, base_s: float, max_s: float, u: float) -> float:
    """The pause after ``failures`` consecutive failures: ``u`` times the exponential cap."""
    if failures <= 0:
        return 0.0
    cap = min(max_s, base_s * 2.0 ** min(failures - 1, 60))
    return max(0.0, min(1.0, u)) * cap


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """Seconds to wait that a ``Retry-After`` header says, or None when absent or unreadable:
    either form of RFC 9110, a number of seconds (``"30"``) or an HTTP-date (IMF-fixdate
    ``Sun, 06 Nov 1994 08:49:37 GMT``, the obsolete RFC 850 and asctime forms too), read against
    ``now_wall`` (epoch seconds). A date in the past is 0. Parsed by hand: no locale."""
    text = (value or "").strip()
    if not text:
        return None
    if text.isdigit():
        return float(int(text))
    try:
        seconds = float(text)  # "1.5": not the standard, but plain enough to honour
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    stamp = _http_date(text)
    return None if stamp is None else max(0.0, stamp - now_wall)


def _http_date(text: str) -> float | None:
    """Epoch seconds of an HTTP-date in any of its three forms, or None."""
    parts = text.replace(",", " ").split()
    try:
        if len(parts) == 6 and parts[5].upper() == "GMT":  # IMF-fixdate: Sun 06 Nov 1994 h GMT
            day, month, year, clock = int(parts[1]), parts[2], int(parts[3]), parts[4]
        elif len(parts) == 4 and parts[3].upper() == "GMT" and "-" in parts[1]:  # RFC 850
            day_s, month, year_s = parts[1].split("-")
            day, year, clock = int(day_s), int(year_s), parts[2]
            year += 1900 if year >= 70 else 2000
            if year < 1970:
                return None
        elif len(parts) == 5:  # asctime: Sun Nov  6 08:49:37 1994
            month, day, clock, year = parts[1], int(parts[2]), parts[3], int(parts[4])
        else:
            return None
        hour, minute, second = (int(p) for p in clock.split(":"))
        stamp = datetime(year, _MONTHS[month.lower()[:3]], day, hour, minute, second, tzinfo=UTC)
    except (KeyError, ValueError):
        return None
    return stamp.timestamp()


@dataclass(slots=True)
class SharedBackoff:
    """The backoff state of one manager, shared by all its calls (see the module docstring).
    ``failed`` after a transient failure returns the pause it set; ``wait_s`` says how long any call
    must still wait before its next request; ``answered`` after any HTTP answer that is the
    manager's (a 2xx, a 4xx other than 408/429) resets the failure count."""

    base_s: float
    max_s: float
    max_after_s: float = 600.0
    """Longest ``Retry-After`` honoured; a longer one is cut to it."""
    failures: int = 0
    """Consecutive failed attempts, all calls together, since the last answer."""
    not_before: float = field(default=-math.inf)
    """No request before this time (the caller's monotonic clock)."""

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.max_s >= self.base_s and self.max_after_s > 0):
            raise ValueError(
                "SharedBackoff needs base_s > 0, max_s >= base_s and max_after_s > 0, got "
                f"{self.base_s!r}, {self.max_s!r}, {self.max_after_s!r}"
            )

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def wait_s(self, now: float) -> float:
        return max(0.0, self.not_before - now)

    def failed(self, now: float, u: float, retry_after_s: float | None = None) -> float:
        """One more failure at ``now``: return the pause before the next request of any call."""
        self.failures += 1
        pause = full_jitter_s(self.failures, self.base_s, self.max_s, u)
        if retry_after_s is not None:
            after = min(max(retry_after_s, 0.0), self.max_after_s)
            pause = max(pause, after * (1.0 + RETRY_AFTER_SPREAD * max(0.0, min(1.0, u))))
        self.not_before = max(self.not_before, now + pause)
        return pause

    def answered(self) -> None:
        """The manager answered: the count starts again (a Retry-After given still holds)."""
        self.failures = 0
