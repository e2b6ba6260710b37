"""The terminal view's mapping: structlog events to what a person sees.

Pure: no I/O, no clock, no terminal library. :meth:`ViewModel.feed` takes one event dict as the
structlog chain has it and returns what the screen does: print a :class:`Line` above the live
area, or show a :class:`Status` there (or :data:`CLEAR` it). Times are the events' own
timestamps, so a recorded run replays the same. A phase's line is printed when the phase ends,
with what it came to; ``run`` when it begins (it lasts). Warnings and errors are one line each,
a repeat in the same phase counted instead of printed. The children's output lines and every
other event are shown only when ``verbose``. ``prove``'s lines are
:mod:`cuzk_supervisor.cli.viewprove`'s; the rendering is :mod:`cuzk_supervisor.cli.screen`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.cli.viewevents import HANDLERS
from cuzk_supervisor.cli.viewprove import prove_closing, prove_status
from cuzk_supervisor.cli.viewstate import ViewState
from cuzk_supervisor.cli.viewtext import (
    CLEAR,
    DOING,
    EXPECTED_DAEMON_S,
    Action,
    Line,
    Status,
    ViewOptions,
    describe,
    duration,
    event_time,
    exit_words,
    is_child_line,
)

__all__ = ["CLEAR", "Action", "Line", "Status", "ViewModel", "ViewOptions"]


@dataclass
class ViewModel(ViewState):
    """The view: events in, screen actions out (see the module doc)."""

    def feed(self, event: Mapping[str, Any]) -> list[Action]:
        t = event_time(event)
        self.now = t if t is not None else self.now
        if self.started is None:
            self.started = self.now
        name = str(event.get("event", ""))
        out: list[Action] = []
        if is_child_line(event):
            if self.options.verbose:
                out.append(Line("child", f"{event.get('source')}: {event.get('line', '')}"))
            return out
        handler = HANDLERS.get(name)
        if handler is not None:
            out.extend(handler(self, event))
        elif event.get("level") in ("warning", "error", "critical"):
            out.extend(self.problem(event))
        told = any(isinstance(a, Line) for a in out) or name == "phase.entered"
        if not told and self.options.verbose:
            out.append(Line("event", describe(event)))
        return out + self._restatus()

    def close(self, exit_code: int, now: float | None) -> list[Action]:
        """The end of the process: the open phase's line, then the summary."""
        if self.closed:
            return []
        self.closed = True
        now = now if now is not None else self.now
        out: list[Action] = [CLEAR]
        took = f" after {duration(now - self.started)}" if now and self.started else ""
        exit_line = Line("summary", f"{exit_code} ({exit_words(exit_code)}){took}", label="exit")
        if self.options.command == "prove":
            return [*out, *prove_closing(self), exit_line]
        if self.phase is not None and self.phase.name != "run":
            out.append(self.phase_line(now, mark="stopped"))
        if self.rate is not None and (self.rate > 0 or not self.failure):
            out.append(Line("summary", f"{self.rate:.1f} proofs/hour{self.verdict}", label="rate"))
            if self.measured:
                out.append(Line("summary", self.measured, label="measured"))
            if self.bound:
                out.append(Line("summary", self.bound, label="bound"))
        if self.failure:
            out.append(Line("summary", self.failure, label="failed"))
        if self.plan:
            out.append(Line("summary", self.plan, label="plan"))
        for index, (what, path) in enumerate(self.options.logs):
            out.append(Line("summary", f"{what:<7}{path}", label="" if index else "logs"))
        return [*out, exit_line]

    def _restatus(self) -> list[Action]:
        status = None if self.closed else self._status()
        if status == self.shown:
            return []
        self.shown = status
        return [status if status is not None else CLEAR]

    def _status(self) -> Status | None:
        if self.options.command == "prove":
            return prove_status(self)
        if self.phase is None:
            return None
        name, since = self.phase.name, self.phase.since
        at = f" at {self.workers} workers" if self.workers else ""
        text = DOING.get(name, name).format(at=at)
        extra: dict[str, Any] = {}
        if name == "register" and self.waiting:
            text = f"waiting for the manager: {self.waiting}"
        elif name == "params" and self.fetch:
            text, f = "downloading the proof parameters", self.fetch
            extra = {"done": f.get("done", 0.0), "unit": "bytes", "rate": self.fetch_rate()}
            if f.get("total"):  # else no sizes expected: the bytes so far
                extra |= {"total": f["total"], "eta_s": f.get("eta"), "eta_at": f.get("at")}
        elif name in EXPECTED_DAEMON_S:
            extra = {"expected_s": EXPECTED_DAEMON_S[name] / max(self.options.time_scale, 1e-9)}
        elif name == "bench" and self.bench.get("planned"):
            rate = self.bench.get("rate")
            extra = {"done": self.bench.get("done", 0.0), "total": self.bench["planned"],
                     "unit": "proofs", "eta_s": self.bench.get("eta"),
                     "eta_at": self.bench.get("at"),
                     "rate": f"{rate:.1f} proofs/h so far" if rate else ""}  # fmt: skip
        if self.headroom:
            text += f", {self.headroom}"
        if self.repeats:
            text += f" ({self.repeats} repeated warnings not shown)"
        return Status(phase=name, text=text, since=since, **extra)
