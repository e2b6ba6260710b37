"""The class of a line where it is made (pure): a milestone or a routine line, and its kind
(the name a summary counts it under). docs/architecture.md, rule 10; the selection that uses it is
:mod:`cuzk_supervisor.core.logselect`.

- The supervisor's own events: a warning or an error is a milestone (but :data:`ROUTINE_WARNINGS`),
  and so is every event of :data:`MILESTONE_EVENTS` (phase transitions, reports, verdicts, the
  daemon's start, ready and exit, the fetch's end, health changes); the rest (progress, status,
  per-proof events) is routine, its kind the event's name.
- A child's output line (the fetch, the daemon, a worker command): a milestone when it is one of
  the first ``head`` lines of that run of the child, its ready line, or an error line (an
  ``ERROR`` level, a panic, an ``error:`` prefix, a traceback); its last lines before an exit are
  made milestones when the exit is seen (``adapters.logship.childtab``). The kind is the child's
  name and the line's level (``daemon INFO``), or ``<name> output``.
"""

from __future__ import annotations

import re

__all__ = ["MILESTONE_EVENTS", "child_line", "event_is_milestone", "line_level"]

MILESTONE_EVENTS = frozenset({
    "supervisor.started", "supervisor.stopping", "phase.entered",
    "manager.registered", "manager.report_done", "manager.bench_verdict", "manager.weather_over",
    "params.fetch_started", "params.fetched", "params.already_verified", "params.present",
    "params.no_fetch", "plan.made", "plan.step_down", "warmup.done", "settle.done",
    "bench.result", "bench.passed", "bench.unjudged", "bench.already_reported",
    "daemon.spawned", "daemon.ready", "daemon.exited", "daemon.replaced",
    "worker.started", "worker.replaced", "health.changed", "pid1.signal",
})  # fmt: skip
"""Info-level events that are milestones: what happened to this machine, in order."""
MILESTONE_LEVELS = frozenset({"warning", "warn", "error", "critical", "exception", "fatal"})
ROUTINE_WARNINGS = frozenset({"child.output_suppressed"})
"""Warnings that are routine lines all the same: about a child's chatter, as many as it writes
(the lines they count are in the child's own tab and summary)."""

_LEVEL = re.compile(r"^\S*\s*(ERROR|WARN|INFO|DEBUG|TRACE)\b")
"""tracing's default format (``<timestamp> <LEVEL> <target>: …``, colours stripped), or a line
that starts with its level."""
_ERROR = re.compile(r"^\s*(error\b|fatal\b|traceback \(most recent call last\))|panicked at", re.I)


def event_is_milestone(event: str, level: str) -> bool:
    """Whether a supervisor event (its name and level) is a milestone."""
    if event in ROUTINE_WARNINGS:
        return False
    return level.lower() in MILESTONE_LEVELS or event in MILESTONE_EVENTS


def line_level(text: str) -> str | None:
    """The level a child's line carries, if it has one (``INFO``, ``ERROR``)."""
    found = _LEVEL.match(text)
    return found.group(1) if found else None


def child_line(
    text: str, index: int, name: str, *, head: int, ready: re.Pattern[str] | None = None
) -> tuple[bool, str]:
    """(milestone, kind) of a child's line: ``index`` its number in this run of the child (0 for
    the first), ``head`` how many first lines are milestones, ``ready`` the child's ready line."""
    level = line_level(text)
    kind = f"{name} {level}" if level else f"{name} output"
    milestone = (
        index < head
        or level == "ERROR"
        or (level is None and _ERROR.search(text) is not None)
        or "panicked at" in text
        or (ready is not None and "ready" in text and ready.search(text) is not None)
    )
    return milestone, kind
