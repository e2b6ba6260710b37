"""The figures of ``bench/fleet.py``: what a fleet's phases cost the manager, per machine, read
from the requests its machines made (``_fleet.Recorder``), the bytes its TLS proxy saw
(``_tlsproxy``) and the simulated manager's own counts.

- **Per phase group** (``params``: register and the fetch; ``bench``: plan to report; ``run``:
  the steady window of the run phase; ``weather``: the proxy's pages): requests and KB a
  minute per machine, the requests of machines in that phase over the minutes they spent in
  it (HTTP bytes, and bytes on the wire with TLS and its handshakes);
- **no 1-second window over 3 x the average**: within the stretch where the whole fleet (or,
  where starts and durations spread it, 80 % of it) is in the phase;
- **dashboard progress**: the longest wait between two log pushes of a machine before the run
  phase;
- **connections**: opened per machine per minute in the run phase's steady window.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from _fleet import Request, VirtualMachine

KB = 1000.0
CLOSE_BYTES = 40
"""A turn this small is a TLS alert (close_notify: 24 bytes), not an HTTP exchange's."""
GROUPS = {
    "params": ("register", "params"),
    "bench": ("plan", "warmup", "restart", "settle", "bench", "report"),
    "run": ("run",),
}


@dataclass
class PhaseCost:
    name: str
    machines: int
    minutes: float  # machine-minutes
    requests: int
    plain_bytes: int
    raw_bytes: int
    busiest_1s: float | None  # busiest 1-s window over the average, within its stretch
    stretch_s: float

    @property
    def per_min(self) -> float:
        return self.requests / self.minutes if self.minutes else math.nan

    @property
    def plain_kb_per_min(self) -> float:
        return self.plain_bytes / KB / self.minutes if self.minutes else math.nan

    @property
    def raw_kb_per_min(self) -> float:
        return self.raw_bytes / KB / self.minutes if self.minutes else math.nan


def intervals(m: VirtualMachine, phases: Iterable[str], end: float) -> list[tuple[float, float]]:
    """When ``m`` was in one of ``phases`` (entered, left), one span for phases in a row."""
    wanted = set(phases)
    marks = [*m.outcome.phases, ("end", end)]
    spans: list[tuple[float, float]] = []
    for i, (phase, at) in enumerate(marks[:-1]):
        if phase not in wanted:
            continue
        left = marks[i + 1][1]
        if spans and spans[-1][1] == at:
            spans[-1] = (spans[-1][0], left)
        else:
            spans.append((at, left))
    return spans


def stretch(spans: Sequence[tuple[float, float]], share: float = 1.0) -> tuple[float, float]:
    """When ``share`` of the machines were in the phase together: from the entry of that
    share to the first exit of the rest."""
    if not spans:
        return (0.0, 0.0)
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    k = max(0, min(len(spans) - 1, math.ceil(share * len(spans)) - 1))
    return starts[k], ends[len(spans) - 1 - k]


def busiest_ratio(times: Sequence[float], t0: float, t1: float) -> float | None:
    """The busiest 1-s window of ``times`` in ``[t0, t1)`` over their mean per second."""
    if t1 - t0 < 10 or not times:
        return None
    n = int(t1 - t0)
    counts = [0] * n
    for t in times:
        k = int(t - t0)
        if 0 <= k < n:
            counts[k] += 1
    mean = sum(counts) / n
    return max(counts) / mean if mean else None


def phase_cost(
    name: str, machines: Sequence[VirtualMachine], requests: Sequence[Request],
    phases: Sequence[str], end: float, window: tuple[float, float] | None = None,
) -> PhaseCost:  # fmt: skip
    """What machines cost while in ``phases`` (only within ``window`` when given)."""
    spans: list[tuple[float, float]] = []
    minutes = 0.0
    ids = {m.index for m in machines}
    for m in machines:
        for start, stop in intervals(m, phases, end):
            if window is not None:
                start, stop = max(start, window[0]), min(stop, window[1])
            if stop > start:
                spans.append((start, stop))
                minutes += (stop - start) / 60
    wanted = set(phases)
    mine = [r for r in requests if r.machine in ids and r.phase in wanted
            and (window is None or window[0] <= r.start < window[1])]  # fmt: skip
    whole = stretch(spans, 1.0)
    t0, t1 = whole if whole[1] - whole[0] >= 60 else stretch(spans, 0.8)
    return PhaseCost(
        name, len(ids), minutes, len(mine),
        sum(r.bytes_in + r.bytes_out for r in mine), sum(r.raw or 0 for r in mine),
        busiest_ratio([r.start for r in mine], t0, t1), max(0.0, t1 - t0),
    )  # fmt: skip


def progress_gap_s(machines: Sequence[VirtualMachine], requests: Sequence[Request]) -> float:
    """The longest wait between two log pushes of one machine in the phases before the run
    phase (the dashboard's progress), all machines."""
    before = set(GROUPS["params"][1:] + GROUPS["bench"][:-1])
    ids = {m.index for m in machines}
    pushes: dict[int, list[float]] = defaultdict(list)
    for r in requests:
        if r.path == "/api/log-push" and r.phase in before and r.machine in ids:
            pushes[r.machine].append(r.start)
    gaps = [b - a for times in pushes.values() for a, b in itertools.pairwise(times)]
    return max(gaps, default=math.nan)


def attribute_raw(machines: Sequence[VirtualMachine], requests: Sequence[Request],
                  seen: list[dict[str, Any]]) -> int:  # fmt: skip
    """Give each request its bytes on the wire (``Request.raw``) from the proxy's turns: the
    last two turns per request (its request, its answer), what came before (the TLS
    handshake) to the connection's first request, a lone last turn (a close) to its last.
    Returns the connections that could not be matched."""
    by_port: dict[int, list[list[list[int]]]] = defaultdict(list)
    for conn in seen:
        by_port[int(conn["port"])].append(conn["turns"])
    groups: dict[tuple[int, int], list[Request]] = defaultdict(list)
    for r in requests:
        if r.port is not None:
            groups[(r.machine, r.connection)].append(r)
    ordered = sorted(groups.values(), key=lambda rs: rs[0].start)
    taken: Counter[int] = Counter()
    unmatched = 0
    for reqs in ordered:
        port = reqs[0].port
        assert port is not None
        candidates = by_port.get(port, [])
        if taken[port] >= len(candidates):
            unmatched += 1
            continue
        turns = candidates[taken[port]]
        taken[port] += 1
        for r, size in zip(reqs, split_turns(turns, len(reqs)), strict=True):
            r.raw = size
    return unmatched


def split_turns(turns: Sequence[Sequence[int]], n: int) -> list[int]:
    """Bytes of each of ``n`` exchanges from a connection's turns (see :func:`attribute_raw`)."""
    sizes = [size for _, size in turns]
    sides = [side for side, _ in turns]
    tail = 0
    # TLS close_notify alerts (24 bytes each way in TLS 1.3), then a request with no answer:
    # to the last exchange. No HTTP exchange's turn is that small.
    while sizes and (sizes[-1] <= CLOSE_BYTES or (sides[-1] == 0 and tail == 0)):
        tail += sizes.pop()
        if sides.pop() == 0 and sizes and sizes[-1] > CLOSE_BYTES:
            break
    pairs: list[int] = []
    while len(sizes) >= 2 and len(pairs) < n and sides[-1] == 1 and sides[-2] == 0:
        pairs.append(sizes.pop() + sizes.pop())
        sides.pop()
        sides.pop()
    pairs.reverse()
    if len(pairs) < n:  # the turns do not pair up: the connection's bytes spread evenly
        total = sum(size for _, size in turns)
        return [total // n] * n
    pairs[0] += sum(sizes)
    pairs[-1] += tail
    return pairs
