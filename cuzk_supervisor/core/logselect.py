"""Which waiting lines of a dashboard tab a push sends, which wait, which are summarised (pure).

Every line has a class where it is made (:mod:`cuzk_supervisor.core.lineclass`): a **milestone** (a
phase transition, a report, a verdict, a warning or an error, a child's first lines, its ready line,
its error lines, its last lines before an exit) or a **routine** line (progress, status, per-proof
lines, a child's INFO and DEBUG chatter), and a **kind** that names it in a summary
(``proof.completed``, ``daemon INFO``). A push of one tab, given ``room`` bytes (:func:`select`):

- when the tab's milestones fit, sends them all, and the newest routine lines that fit what is
  left, in time order; the other routine lines are left out and counted by kind;
- when they do not, sends the oldest milestones that fit and keeps the rest waiting for the next
  push (no routine line goes while a milestone waits); past ``hold_room`` bytes of them waiting
  (a crash loop's exits), the newest that fit are kept and the middle is summarised: the story's
  first and last milestones reach the dashboard. The last push (``hold_room`` 0: the shipper
  stops) sends the first milestones that fit half its room and the last that fit the rest.

Each waiting line is in exactly one of the three answers: ``shipped + held + left out`` is every
line waiting, so lines pushed plus lines counted in summaries is every line written. A
:class:`Tally` counts the left-out lines by kind, and :func:`summary_line` says it in one line,
at the head of the tab's next body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SUMMARY_MAX_BYTES", "Selection", "Tally", "newest_fitting", "select", "summary_line"]

SUMMARY_MAX_BYTES = 320
"""A summary line is at most this long (a push keeps room for it)."""
_KINDS_NAMED = 4
"""The most kinds a summary names one by one; the rest as one count."""


@dataclass(frozen=True, slots=True)
class Selection:
    """Indices into the waiting lines (oldest first), each in one of the three."""

    ship: tuple[int, ...]
    """Sent now, in time order."""
    hold: tuple[int, ...]
    """Milestones that wait for a later push."""
    left_out: tuple[int, ...]
    """Counted in the summary, never sent."""


def newest_fitting(sizes: Sequence[int], room: int) -> int:
    """How many of the newest lines fit ``room`` bytes (``sizes`` oldest first)."""
    used = count = 0
    for size in reversed(sizes):
        if used + size > room:
            break
        used += size
        count += 1
    return count


def _oldest_fitting(sizes: Sequence[int], room: int) -> int:
    return newest_fitting(sizes[::-1], room)


def select(lines: Sequence[tuple[int, bool]], room: int, hold_room: int) -> Selection:
    """The push of one tab: ``lines`` are (size, milestone) of the lines waiting, oldest first;
    ``room`` the bytes this push may send, ``hold_room`` the bytes of milestones that may wait
    for a later one (see the module docstring)."""
    milestones = [i for i, (_, milestone) in enumerate(lines) if milestone]
    routine = [i for i, (_, milestone) in enumerate(lines) if not milestone]
    sizes = [size for size, _ in lines]
    needed = sum(sizes[i] for i in milestones)
    if needed <= room:
        kept = newest_fitting([sizes[i] for i in routine], room - needed)
        cut = len(routine) - kept
        ship = sorted(milestones + routine[cut:])
        return Selection(tuple(ship), (), tuple(routine[:cut]))
    if hold_room <= 0:  # the last push: the first and the last milestones that fit now
        first = _oldest_fitting([sizes[i] for i in milestones], room // 2)
        used = sum(sizes[i] for i in milestones[:first])
        last = newest_fitting([sizes[i] for i in milestones[first:]], room - used)
        ship = milestones[:first] + milestones[len(milestones) - last :]
        left_out = sorted(routine + milestones[first : len(milestones) - last])
        return Selection(tuple(ship), (), tuple(left_out))
    first = _oldest_fitting([sizes[i] for i in milestones], room)
    rest = milestones[first:]
    last = newest_fitting([sizes[i] for i in rest], hold_room)
    middle = rest[: len(rest) - last]
    left_out = sorted(routine + middle)
    return Selection(tuple(milestones[:first]), tuple(rest[len(rest) - last :]), tuple(left_out))


@dataclass(slots=True)
class Tally:
    """Lines left out of one tab, by kind: what its next summary line stands for."""

    lines: int = 0
    bytes: int = 0
    milestones: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, size: int, milestone: bool) -> None:
        self.lines += 1
        self.bytes += size
        self.milestones += milestone
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def merge(self, other: Tally) -> None:
        self.lines += other.lines
        self.bytes += other.bytes
        self.milestones += other.milestones
        for kind, count in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + count


def summary_line(tally: Tally, bytes_per_min: float) -> str:
    """The line that stands for the lines of ``tally``: their count first, then by kind, the
    commonest first (``[412 lines not pushed (52.1 KB) …: 206 proof.completed, 198 daemon INFO,
    8 of 2 other kinds]``); at most :data:`SUMMARY_MAX_BYTES`."""
    ranked = sorted(tally.kinds.items(), key=lambda item: (-item[1], item[0]))
    named = [f"{count:,} {kind[:40]}" for kind, count in ranked[:_KINDS_NAMED]]
    others = ranked[_KINDS_NAMED:]
    if others:
        named.append(f"{sum(c for _, c in others):,} of {len(others)} other kinds")
    among = f", {tally.milestones:,} of them milestones" if tally.milestones else ""
    line = (
        f"[{tally.lines:,} lines not pushed ({tally.bytes / 1000:,.1f} KB{among}), past this "
        f"machine's log budget of {bytes_per_min / 1000:g} KB/min in this phase: "
        + ", ".join(named)
        + "]"
    )
    if len(line.encode()) > SUMMARY_MAX_BYTES:
        line = line.encode()[: SUMMARY_MAX_BYTES - 4].decode(errors="ignore") + " …]"
    return line
