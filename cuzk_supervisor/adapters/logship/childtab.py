"""A child's output for its dashboard tab: each line classed as it comes (``lineclass.child_line``:
the first lines of a run, the ready line, error lines are milestones), and, when its output ends
(the child exited), its last routine lines made milestones too. An ``OutputPump`` sink: one pump
is one run of the child, its line numbers start at 0 with each run.
"""

from __future__ import annotations

import re
from collections import deque

from cuzk_supervisor.adapters.logship.lines import LineTaker
from cuzk_supervisor.core.lineclass import child_line

__all__ = ["ChildTab"]


class ChildTab:
    """The lines of one child (``name``: ``daemon``, ``fetch``, ``curio``) for the tab
    ``source`` (which its owner may change between runs: the daemon's tab is ``benchdaemon``
    until the bench is reported, then ``cuzk``)."""

    def __init__(
        self,
        shipper: LineTaker,
        source: str,
        name: str,
        *,
        head: int,
        tail: int,
        ready: re.Pattern[str] | None = None,
    ) -> None:
        self.source = source
        self.name = name
        self._shipper = shipper
        self._head = head
        self._ready = ready
        self._tail: deque[tuple[str, int]] = deque(maxlen=tail)

    def line(self, text: str, index: int) -> None:
        """Line ``index`` (from 0) of this run of the child."""
        if index == 0:
            self._tail.clear()  # a new run: the last one's tail was told at its end
        milestone, kind = child_line(text, index, self.name, head=self._head, ready=self._ready)
        seq = self._shipper.add_line(self.source, text, milestone=milestone, kind=kind)
        if seq is not None and not milestone and self._tail.maxlen:
            self._tail.append((self.source, seq))

    def note(self, text: str) -> None:
        """A milestone of the supervisor's about this child, in its tab (its exit)."""
        self._shipper.add_line(self.source, text, milestone=True, kind=f"{self.name} exits")

    def end(self) -> None:
        """The child's output ended: its last routine lines are milestones."""
        tail, self._tail = list(self._tail), deque(maxlen=self._tail.maxlen)
        for source in {source for source, _ in tail}:
            self._shipper.promote(source, [seq for src, seq in tail if src == source])
