"""Jittered periodic timers (pure): a fleet started from one image must not tick in step.

docs/architecture.md, rule 7: machines started in the same second would otherwise poll the manager
in the same second of every interval, forever. Every periodic manager-facing timer (the status
line, the kill look-up, the ``/running`` ping, the log flush) therefore

- fires its first tick at a uniformly random point of its interval (:func:`first_delay`), and
- varies every later interval by up to ``± spread`` of it (:func:`next_delay`),
- starts afresh when its interval changes (:meth:`JitteredSchedule.set_interval`): the first
  tick at the new interval again anywhere in it,

so the phases of a fleet spread out at once and keep drifting apart. The random draws are
arguments (``u`` in ``[0, 1)``); :class:`JitteredSchedule` holds a draw function the caller
gives (``random.Random(seed).random`` in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_SPREAD", "MAX_SPREAD", "JitteredSchedule", "first_delay", "next_delay"]

DEFAULT_SPREAD = 0.2
MAX_SPREAD = 0.5


def _unit(u: float) -> float:
    return max(0.0, min(1.0, u))


def first_delay(interval_s: float, u: float) -> float:
    """The first tick: anywhere in ``[0, interval_s)``."""
    return interval_s * _unit(u)


def next_delay(interval_s: float, spread: float, u: float) -> float:
    """A later tick: ``interval_s`` varied by up to ``± spread`` of it."""
    spread = max(0.0, min(MAX_SPREAD, spread))
    return interval_s * (1.0 - spread + 2.0 * spread * _unit(u))


@dataclass(slots=True)
class JitteredSchedule:
    """The delays of one periodic timer: :meth:`delay` gives the first, then the next ones."""

    interval_s: float
    spread: float
    draw: Callable[[], float]
    started: bool = False

    def delay(self) -> float:
        if not self.started:
            self.started = True
            return first_delay(self.interval_s, self.draw())
        return next_delay(self.interval_s, self.spread, self.draw())

    def set_interval(self, interval_s: float) -> None:
        """A new interval starts afresh: its first tick anywhere in it, as at the start. A fleet
        that changes interval together (the log flush at the run phase) would otherwise keep
        the phases of the old one, bunched within ``± spread`` of the new interval, for many
        ticks. The same interval again changes nothing."""
        if interval_s != self.interval_s:
            self.interval_s = interval_s
            self.started = False
