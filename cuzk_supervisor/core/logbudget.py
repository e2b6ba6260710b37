"""What the log shipper may push, turn by turn (pure): a budget of requests and bytes a minute,
and which lines of each source fit it.

docs/architecture.md, rule 7: a machine's log traffic must not depend on what its children write. A
fetch that prints a progress line per block, or a daemon that writes 1,000 lines a second, would
otherwise cost the manager as much as they write (and the manager keeps 10,000 lines an instance, in
memory, for ever). So the shipper pushes in **turns**, one every ``interval_s`` (jittered), and each
turn spends from two token buckets (:class:`~cuzk_supervisor.core.pace.Pace`): requests (one a
source pushed) and body bytes. A turn

- pushes the supervisor's own tab first (its status line is the dashboard's progress), then
  the other sources, the one holding the oldest line first, while a request token is left;
- splits the bytes it may spend among those sources so that a quiet source sends all it has
  and a chatty one the rest (:func:`share`), every tab's milestones served before any tab's
  routine lines (:func:`share_by_class`);
- sends a source's milestones first, then its **newest** routine lines that fit its share
  (:mod:`cuzk_supervisor.core.logselect`); the others are summarised by one line that counts
  them by kind, at the head of that source's next body.

A push that fails spends its tokens all the same: weather or an outage never brings the next
push sooner. Two budgets (:data:`BEFORE_RUN`, :data:`RUN`); their byte rates are settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BEFORE_RUN", "RUN", "Budget", "order_sources", "share", "share_by_class"]


@dataclass(frozen=True, slots=True)
class Budget:
    interval_s: float
    """A turn this often (jittered)."""
    requests_per_min: float
    bytes_per_min: float
    """Body bytes (the lines), on average."""
    burst_requests: float
    burst_bytes: float

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.requests_per_min > 0 and self.bytes_per_min > 0):
            raise ValueError(f"a log budget needs positive rates, got {self!r}")
        if not (self.burst_requests >= 1 and self.burst_bytes >= 1):
            raise ValueError(f"a log budget needs bursts >= 1, got {self!r}")

    def with_bytes(self, bytes_per_min: float) -> Budget:
        """This budget at another byte rate (its burst the same share of a minute)."""
        share = self.burst_bytes / self.bytes_per_min
        return Budget(self.interval_s, self.requests_per_min, bytes_per_min,
                      self.burst_requests, max(1.0, bytes_per_min * share))  # fmt: skip


BEFORE_RUN = Budget(
    interval_s=20.0, requests_per_min=4.0, bytes_per_min=12_000.0,
    burst_requests=2.0, burst_bytes=6_000.0,
)  # fmt: skip
"""Register to report: a turn every 20 s (so the dashboard moves at least every 30 s with the
jitter), 4 pushes and 12 KB of lines a minute; with the reports and their headers, under 6
requests and 20 KB a minute."""
RUN = Budget(
    interval_s=120.0, requests_per_min=1.0, bytes_per_min=2_400.0,
    burst_requests=2.0, burst_bytes=4_800.0,
)  # fmt: skip
"""The run phase: a turn every ``log_push_interval_s`` (120 s), one push and 2.4 KB a minute;
with the ``/running`` ping, under 1.5 requests and 4 KB a minute."""


def order_sources(oldest: Mapping[str, int], first: str) -> list[str]:
    """The order sources are pushed in: ``first`` (the supervisor's own tab) if it has
    anything, then by their oldest line's sequence number (``oldest``)."""
    rest = sorted((s for s in oldest if s != first), key=lambda s: oldest[s])
    return ([first] if first in oldest else []) + rest


def share(pending: Mapping[str, int], room: float) -> dict[str, int]:
    """Bytes each source may push this turn out of ``room``: the sources that need least are served
    first, each up to an equal share of what is left (a quiet tab sends all it has)."""
    left = max(0.0, room)
    out: dict[str, int] = {}
    ordered = sorted(pending, key=lambda s: pending[s])
    for index, source in enumerate(ordered):
        out[source] = int(min(pending[source], left / (len(ordered) - index)))
        left -= out[source]
    return out


def share_by_class(
    milestones: Mapping[str, int], pending: Mapping[str, int], room: float
) -> dict[str, int]:
    """Bytes each source may push out of ``room``: first its milestones' bytes (``milestones``,
    shared as :func:`share`), then the rest of what it has (``pending``, all its bytes) out of
    what is left: no tab's routine lines before every tab's milestones."""
    first = share(milestones, room)
    left = room - sum(first.values())
    rest = share({s: max(0, pending[s] - first[s]) for s in pending}, left)
    return {s: first.get(s, 0) + rest[s] for s in pending}
