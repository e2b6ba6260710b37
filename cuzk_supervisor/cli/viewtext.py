"""The terminal view's vocabulary: its options, the screen actions, and the words and numbers
it prints (pure: no I/O, no clock). See :mod:`cuzk_supervisor.cli.view`."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cuzk_supervisor import exitcodes

PHASES = ("register", "params", "plan", "warmup", "restart", "settle", "bench", "report", "run")
"""The lifecycle's phases in order (``phase.entered``); ``finished``: an earlier verdict stands."""

EXPECTED_DAEMON_S = {"warmup": 360.0, "restart": 90.0, "settle": 90.0}
"""What a phase usually takes, in daemon seconds (docs/daemon.md, "Measured figures": one warmup
359 s at 2 workers; a restart with its SRS load 1-2 min; a settle proof about as long)."""

DOING = {
    "register": "registering with the manager",
    "params": "checking the proof parameters",
    "plan": "planning workers from the memory limit",
    "warmup": "warmup proof{at} (SRS load, PCE extraction)",
    "restart": "restarting the daemon{at}",
    "settle": "settle proof{at} (first use after the restart)",
    "bench": "benchmark{at}",
    "report": "reporting the rate",
    "run": "proving{at}",
    "finished": "finished earlier",
}
"""The live line's words for each phase; ``{at}``: `` at W workers`` once W is known."""

EXIT_WORDS = {
    exitcodes.OK: "ok",
    exitcodes.FAILURE: "failed",
    exitcodes.USAGE: "bad input",
    exitcodes.DAEMON_FAILED_TO_START: "daemon failed to start",
    exitcodes.DAEMON_CRASH_LOOP: "daemon crash loop",
    exitcodes.OUT_OF_MEMORY: "out of memory",
    exitcodes.BENCH_FAILED: "benchmark failed",
    exitcodes.INSTANCE_GONE: "instance gone at the manager",
    exitcodes.PARAMS_FAILED: "parameters failed",
    exitcodes.STATE_UNWRITABLE: "state file unwritable",
    exitcodes.HEALTH_BROKEN: "machine broken, the manager told",
}

_QUIET_KEYS = frozenset(
    {"event", "level", "timestamp", "phase", "uuid", "source", "stream", "logger", "exception"}
)
_MAIN_KEYS = ("reason", "detail", "error", "cause")


@dataclass(frozen=True, slots=True)
class ViewOptions:
    command: str = "run"  # run, sim or prove (prove has no phases)
    verbose: bool = False  # also the children's output lines and every other event
    time_scale: float = 1.0  # daemon seconds per wall second (``rate_time_scale``)
    min_rate: float = 0.0
    logs: tuple[tuple[str, str], ...] = ()  # (what, path) for the closing summary


@dataclass(frozen=True, slots=True)
class Line:
    """One line printed above the live area; ``kind`` picks its look."""

    kind: str  # phase, warning, error, note, child, event or summary
    text: str
    phase: str = ""
    mark: str = ""  # phase lines: done, failed, stopped or running
    took_s: float | None = None
    label: str = ""  # summary lines: rate, plan, logs or exit


@dataclass(frozen=True, slots=True)
class Status:
    """The live line: what is happening now. Elapsed time and countdowns are the screen's,
    from ``since`` and ``eta_at`` (epoch seconds of the events)."""

    phase: str
    text: str
    since: float | None = None
    done: float | None = None
    total: float | None = None
    unit: str = ""  # bytes or proofs: ``done`` of ``total`` as a bar
    expected_s: float | None = None  # elapsed against this (wall seconds), as a bar
    expected_is_limit: bool = False  # a deadline ("of at most"), not a usual time ("of about")
    eta_s: float | None = None
    eta_at: float | None = None
    rate: str = ""


@dataclass(frozen=True, slots=True)
class Clear:
    """Nothing live any more."""


CLEAR = Clear()
Action = Line | Status | Clear


def event_time(event: Mapping[str, Any]) -> float | None:
    """The event's ISO timestamp (``TimeStamper``) as epoch seconds; None when it has none."""
    stamp = event.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def size(value: float | None) -> str:
    amount = float(value or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{int(amount)} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def duration(seconds: float | None) -> str:
    """``0.7s``, ``42s``, ``6m05s``, ``2h03m``."""
    value = max(0.0, float(seconds or 0))
    if value < 10:
        return f"{value:.1f}s"
    total = int(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def exit_words(code: int) -> str:
    if code > exitcodes.SIGNAL_BASE:
        number = code - exitcodes.SIGNAL_BASE
        try:
            return f"stopped by {signal.Signals(number).name}"
        except ValueError:
            return f"stopped by signal {number}"
    return EXIT_WORDS.get(code, "failed")


def is_child_line(event: Mapping[str, Any]) -> bool:
    """A line of a child's output (daemon, fetch, worker), carried as a ``child.line`` event."""
    return event.get("event") == "child.line"


def describe(event: Mapping[str, Any]) -> str:
    """Any event as one readable line: its name, its reason, a few of its fields."""
    name = str(event.get("event", ""))
    main = next((str(event[k]) for k in _MAIN_KEYS if event.get(k) not in (None, "")), "")
    extras = [
        f"{key} {short(value)}"
        for key, value in event.items()
        if key not in _QUIET_KEYS and key not in _MAIN_KEYS and not key.startswith("_")
        and short(value)
    ][:4]  # fmt: skip
    text = f"{name}: {main}" if main else name
    return f"{text} ({', '.join(extras)})" if extras else text


def short(value: object) -> str:
    """A field's value as a few words; empty for what does not fit on a line."""
    if isinstance(value, list | tuple) and 0 < len(value) <= 5:
        parts = [short(item) for item in value]
        return ", ".join(parts) if all(parts) else ""
    if isinstance(value, str | int | float | bool) and value != "":
        return str(value)
    return ""


def plan_head(summary: object) -> str:
    """The plan's numbers, without the rule that made them (``summary`` up to its colon)."""
    return str(summary or "").split(":", 1)[0].strip()


@dataclass
class PhaseState:
    """A phase as the view knows it: when it began and what it came to so far."""

    name: str
    since: float | None
    note: str = ""
    failed: str = ""
    mark: str = ""
