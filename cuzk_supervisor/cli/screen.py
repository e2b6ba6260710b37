"""The terminal view's rendering with rich: lines above, one live line below.

Thin on purpose: what to show is :mod:`cuzk_supervisor.cli.view`'s (pure). rich's refresh thread
redraws the live line 4 times a second, so the elapsed time, its bars and the countdowns move
between events. Imported only when the view is shown (rich is not loaded otherwise).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from cuzk_supervisor.cli.viewtext import Action, Clear, Line, Status, duration, size

_MARKS = {"done": ("✓", "green"), "failed": ("✗", "bold red"), "running": ("▶", "cyan"),
          "stopped": ("■", "yellow")}  # fmt: skip
_ASCII = {"✓": "+", "✗": "x", "▶": ">", "■": "#", "⚠": "!", "·": "-", "│": "|"}
_BAR_WIDTH = 20
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Screen:
    """Prints :class:`Line` actions and keeps a :class:`Status` live; thread-safe."""

    def __init__(self, stream: TextIO, *, clock: Callable[[], float] = time.time) -> None:
        self.console = Console(file=stream, highlight=False)
        self._clock = clock
        self._status: Status | None = None
        self._summary_started = False
        self._lock = threading.RLock()
        self._unicode = (self.console.encoding or "").lower().startswith("utf")
        self._live: Live | None = None

    def apply(self, actions: Iterable[Action]) -> None:
        with self._lock:
            for action in actions:
                if isinstance(action, Line):
                    self.console.print(self.line(action))
                elif isinstance(action, Status):
                    self._status = action
                    self._start()
                elif isinstance(action, Clear):
                    self._status = None
                    self._stop()

    def close(self) -> None:
        with self._lock:
            self._status = None
            self._stop()

    def _start(self) -> None:
        if self._live is None:
            self._live = Live(
                console=self.console,
                get_renderable=self._render,
                transient=True,
                refresh_per_second=4,
                # Other output on the terminal goes above the live line, not through it.
                redirect_stdout=sys.stdout.isatty(),
                redirect_stderr=False,
            )
            self._live.start()
        else:
            self._live.refresh()

    def _stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def _mark(self, char: str) -> str:
        return char if self._unicode else _ASCII.get(char, char)

    def line(self, line: Line) -> Text:
        if line.kind == "phase":
            char, style = _MARKS.get(line.mark, ("·", ""))
            took = duration(line.took_s) if line.took_s is not None else ""
            return Text.assemble(
                (f" {self._mark(char)} ", style),
                (f"{line.phase:<9}", "bold"),
                (f"{took:>6}  ", "dim"),
                (line.text, "red" if line.mark == "failed" else ""),
            )
        if line.kind == "summary":
            lead = "" if self._summary_started else "\n"
            self._summary_started = True
            return Text.assemble(lead, (f" {line.label:<7}", "bold"), (line.text, ""))
        looks = {"warning": ("⚠", "yellow"), "error": ("✗", "bold red"), "child": ("│", "dim")}
        look = looks.get(line.kind, ("·", "dim"))
        return Text(f"   {self._mark(look[0])} {line.text}", style=look[1])

    def _render(self) -> RenderableType:
        status = self._status
        if status is None:
            return Text("")
        return self.status(status, self._clock())

    def status(self, status: Status, now: float) -> Text:
        """The live line: spinner, phase, a bar, the figures, then the words (cut to fit)."""
        elapsed = now - status.since if status.since is not None else None
        figures: list[str] = []
        bar: Text | None = None
        if status.unit and status.total:
            bar = self._bar((status.done or 0) / status.total)
            if status.unit == "bytes":
                figures.append(f"{size(status.done)} of {size(status.total)}")
            else:
                figures.append(f"{status.done or 0:.0f} of {status.total:.0f} proofs")
        elif status.unit == "proofs":
            figures.append(f"{status.done or 0:.0f} proofs done")
        elif status.unit == "bytes":
            figures.append(f"{size(status.done)} so far")
        if status.rate:
            figures.append(status.rate)
        if status.eta_s is not None and status.eta_at is not None:
            figures.append(f"ETA {duration(max(0.0, status.eta_s - (now - status.eta_at)))}")
        if status.expected_s and elapsed is not None:
            over = elapsed > status.expected_s
            bar = self._bar(elapsed / status.expected_s, "yellow" if over else "cyan")
            late = ", longer than usual" if over and not status.expected_is_limit else ""
            word = "at most" if status.expected_is_limit else "about"
            figures.append(f"{duration(elapsed)} of {word} {duration(status.expected_s)}{late}")
        elif elapsed is not None:
            figures.append(duration(elapsed))
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append(f" {self._spinner(now)} ", "cyan")
        line.append(f"{status.phase:<9}", "bold cyan")
        if bar is not None:
            line.append_text(bar)
            line.append(" ")
        line.append(" · ".join(figures))
        line.append(f"  {status.text}", "dim")
        line.truncate(max(self.console.width - 1, 20), overflow="ellipsis")
        return line

    def _spinner(self, now: float) -> str:
        if not self._unicode:
            return "|/-\\"[int(now * 4) % 4]
        return _SPINNER[int(now * 10) % len(_SPINNER)]

    def _bar(self, fraction: float, style: str = "cyan") -> Text:
        filled = round(max(0.0, min(fraction, 1.0)) * _BAR_WIDTH)
        full, empty = ("━", "━") if self._unicode else ("#", "-")
        bar = Text(full * filled, style)
        bar.append(empty * (_BAR_WIDTH - filled), "grey37")
        return bar
