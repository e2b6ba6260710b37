"""The terminal view's state, apart from the view that feeds it events, so that the event
handlers (:mod:`.viewevents`, :mod:`.viewprove`) and the view (:mod:`.view`) import no circle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cuzk_supervisor.cli.viewtext import (
    Action,
    Line,
    PhaseState,
    Status,
    ViewOptions,
    describe,
    size,
)


@dataclass
class ViewState:
    """What the screen shows so far, and the small steps the event handlers take on it."""

    options: ViewOptions = field(default_factory=ViewOptions)
    phase: PhaseState | None = None
    last_phase: str = "start"
    started: float | None = None
    now: float | None = None
    workers: int | None = None
    plan_workers: tuple[int, int] = (0, 0)  # (warmup, full) of the latest plan
    plan: str = ""
    rate: float | None = None
    measured: str = ""  # the rate's uncertainty, proofs and why the batch stopped
    bound: str = ""  # what bounded the rate (``bench.result``'s ``bound``)
    verdict: str = ""
    failure: str = ""
    fetch: dict[str, float] = field(default_factory=dict)
    bench: dict[str, float] = field(default_factory=dict)
    prove: dict[str, float] = field(default_factory=dict)
    """prove: count, done, failed, ended, running, since, eta, at, waited_since, deadline,
    proof_elapsed_s, partitions_done, partitions_total."""
    summary: dict[str, Any] = field(default_factory=dict)  # prove: its ``prove.summary``
    waiting: str = ""
    headroom: str = ""
    seen: set[tuple[str, str]] = field(default_factory=set)
    repeats: int = 0
    shown: Status | None = None
    closed: bool = False

    def note(self, text: str) -> list[Action]:
        if self.phase is not None:
            self.phase.note = text
        return []

    def phase_line(self, now: float | None, mark: str) -> Line:
        assert self.phase is not None
        p, self.phase = self.phase, None
        took = now - p.since if now is not None and p.since is not None else None
        text = p.failed or p.note
        mark = "failed" if p.failed else p.mark or mark
        return Line("phase", text, phase=p.name, mark=mark, took_s=took)

    def problem(self, event: Mapping[str, Any], text: str = "") -> list[Action]:
        text = text or describe(event)
        key = (str(event.get("event", "")), text)
        if key in self.seen:
            self.repeats += 1
            return []
        self.seen.add(key)
        kind = "warning" if event.get("level") == "warning" else "error"
        return [Line(kind, text)]

    def fail(self, reason: str) -> list[Action]:
        where = self.phase.name if self.phase is not None else self.last_phase
        self.failure = f"in {where}: {reason}"
        if self.phase is None:
            return [Line("error", reason)]
        self.phase.failed = reason
        return [self.phase_line(self.now, mark="failed")]

    def fetch_rate(self) -> str:
        rate = self.fetch.get("rate")
        return f"{size(rate)}/s" if rate else ""
