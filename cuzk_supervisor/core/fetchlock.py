"""Whose turn it is at the params fetch lock, and what to do about its holder (issue 46). Pure.

The lock (``adapters/paramslock.py``) is an exclusive ``flock`` on a file in the params folder,
held by a fetch for its lifetime. Finding it held, the supervisor knows two things: which
process took it (the kernel keeps its pid with the lock) and whether that process still runs. From
those and how long it has waited, this module decides: stop the holders, wait, or give up.
"""

from __future__ import annotations

import enum


class Holder(enum.Enum):
    """Who holds the lock, as far as the supervisor can tell."""

    OURS = "ours"
    """This supervisor took it last: its fetch has ended, what still holds it is a straggler."""
    ORPHANED = "orphaned"
    """Its supervisor is gone (exited, killed, a zombie): nobody else will stop its fetch."""
    ANOTHERS = "another's"
    """A running supervisor's fetch (a second instance on this host, or one still dying)."""
    UNKNOWN = "unknown"
    """Its taker is not visible (another pid namespace), or the lock changed hands as we looked."""


class Turn(enum.Enum):
    STOP = "stop"
    WAIT = "wait"
    GIVE_UP = "give up"


def holder(locker: int | None, me: int, locker_running: bool) -> Holder:
    """``locker``: the pid that took the lock (None: not visible from here); ``me``: ours. A pid,
    not a start time: the kernel keeps the taker's pid with the lock, at the moment it takes it (a
    name written in the file after taking it could be a predecessor's for a moment). A dead taker's
    pid reused by another process reads as running: waited for, never stopped."""
    if locker is None:
        return Holder.UNKNOWN
    if locker == me:
        return Holder.OURS
    return Holder.ANOTHERS if locker_running else Holder.ORPHANED


def turn(who: Holder, waited_s: float, wait_s: float) -> Turn:
    """Stop a holder nobody else will stop (ours after our fetch, a dead supervisor's); wait
    for the others; give up once more than ``wait_s`` has passed with the lock still held (also
    when stopping did not free it: a holder stuck in the kernel). The first look (``waited_s``
    0) never gives up: a wait of 0 still stops a dead supervisor's fetch, then looks once."""
    if waited_s > wait_s:
        return Turn.GIVE_UP
    return Turn.STOP if who in (Holder.OURS, Holder.ORPHANED) else Turn.WAIT


def why(who: Holder, locker: int | None) -> str:
    """The reason for the line that says why the params phase waits, stops or gives up."""
    pid = locker
    return {
        Holder.OURS: "our fetch has ended but processes it started still hold the params lock",
        Holder.ORPHANED: f"the params fetch of supervisor {pid}, which is gone, is still running",
        Holder.ANOTHERS: f"supervisor {pid} (still running) is fetching into the same folder",
        Holder.UNKNOWN: "a process not visible from here holds the params lock",
    }[who]
