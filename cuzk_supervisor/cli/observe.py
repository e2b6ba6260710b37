"""Structured logging setup (structlog): JSON lines off a terminal; on one, a person's view.

Off a terminal (or with ``log_format=json``) every event is one JSON line on stderr. On a
terminal, ``run``, ``sim`` and ``prove`` (a :class:`TerminalView`) show the view of
:mod:`cuzk_supervisor.cli.view` (drawn by :mod:`cuzk_supervisor.cli.screen`, which loads rich:
imported only then) and write the JSON lines to their events file instead (``run`` and ``sim``:
``log_dir/supervisor.log``, rotated as the daemon's log is; ``prove``, a client run beside a
supervisor, keeps none). The view sees every event from info up, whatever ``log_level`` says;
the events file and the manager are still held to ``log_level``. Other commands on a terminal,
and ``log_format=console``, get structlog's colour console.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from cuzk_supervisor.logcontext import add_context

if TYPE_CHECKING:
    # Imported where the view is shown: a run off a terminal (the container's) loads neither.
    from cuzk_supervisor.cli.screen import Screen
    from cuzk_supervisor.cli.view import ViewOptions
    from cuzk_supervisor.daemon.output import RotatingLineFile
    from cuzk_supervisor.settings import Settings

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
EVENTS_FILE = "supervisor.log"
"""The events file in ``log_dir`` while the terminal view is shown (JSON lines)."""


@dataclass(frozen=True, slots=True)
class TerminalView:
    """What a command shows on a terminal (see the module docstring)."""

    options: ViewOptions
    events_file: Path | None = None
    events_max_bytes: int = 64 * 1024 * 1024
    events_backups: int = 3
    force: bool = False  # shown on a stream that is not a terminal (tests)


def add_view_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="on a terminal, also show the daemon's output lines and every other event "
        "(as log_level=debug does); off a terminal nothing changes",
    )


def lifecycle_view(
    s: Settings, *, command: str, min_rate: float, verbose: bool = False
) -> TerminalView:
    """The view of ``run`` and ``sim``, its events file beside the daemon's log."""
    from cuzk_supervisor.cli.view import ViewOptions

    events = s.log_dir / EVENTS_FILE
    logs = (("events", str(events)), ("daemon", str(s.log_dir / "cuzk.log")),
            ("state", str(s.state_dir / "state.json")))  # fmt: skip
    options = ViewOptions(command=command, verbose=verbose, time_scale=s.rate_time_scale,
                          min_rate=min_rate, logs=logs)  # fmt: skip
    return TerminalView(options, events, s.daemon_log_max_bytes, max(1, s.daemon_log_backups))


class _Shown:
    """The view installed in this process."""

    def __init__(self, view: TerminalView, out: TextIO, level: str) -> None:
        from cuzk_supervisor.cli.screen import Screen  # rich: only when the view is shown
        from cuzk_supervisor.cli.view import ViewModel

        verbose = view.options.verbose or level == "debug"
        self.model = ViewModel(dataclasses.replace(view.options, verbose=verbose))
        self.screen: Screen = Screen(out)
        self.view = view
        self.lock = threading.RLock()
        self.json = structlog.processors.JSONRenderer()
        self._file: RotatingLineFile | None = None
        self._file_failed = view.events_file is None

    def tap(self, logger: Any, method: str, event_dict: structlog.typing.EventDict) -> Any:
        """Processor: the view sees the event, unchanged."""
        with self.lock:
            try:
                self.screen.apply(self.model.feed(event_dict))
            except Exception as exc:  # the view must never break logging
                self.screen.console.print(f"(terminal view: {type(exc).__name__}: {exc})")
        return event_dict

    def write(self, logger: Any, method: str, event_dict: structlog.typing.EventDict) -> Any:
        """Final processor: the JSON line to the events file, nothing to the terminal."""
        line = self.json(logger, method, event_dict)  # str with the default serializer
        data = line.encode() if isinstance(line, str) else line
        with self.lock:
            target = self._events_file()
            if target is not None:
                target.write_lines([data + b"\n"])
        raise structlog.DropEvent

    def _events_file(self) -> RotatingLineFile | None:
        if self._file is None and not self._file_failed:
            from cuzk_supervisor.adapters.files import WriteError
            from cuzk_supervisor.daemon.output import RotatingLineFile

            assert self.view.events_file is not None
            try:  # opened at the first event, after every check before the start has passed
                self._file = RotatingLineFile(
                    self.view.events_file, self.view.events_max_bytes, self.view.events_backups
                )
            except WriteError as exc:
                self._file_failed = True
                self.screen.console.print(f"   events are not kept: {exc}", style="yellow")
        return self._file

    def finish(self, code: int) -> None:
        with self.lock:
            self.screen.apply(self.model.close(code, time.time()))
            self.screen.close()


_SHOWN: _Shown | None = None
_EVER_SHOWN = False


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stderr by default) is a terminal."""
    return (stream if stream is not None else sys.stderr).isatty()


def view_shown() -> bool:
    """Whether this process has shown the terminal view (its own lines then say it all)."""
    return _EVER_SHOWN


def view_active() -> bool:
    """Whether the terminal view is shown now (configured and not finished yet)."""
    return _SHOWN is not None


def say_error(command: str, message: str) -> None:
    """An error that ends ``command``; while the view is shown, the view's own error line."""
    shown = _SHOWN
    if shown is None:
        print(f"cuzk-supervisor {command}: error: {message}", file=sys.stderr, flush=True)
        return
    from cuzk_supervisor.cli.view import Line

    with shown.lock:
        shown.screen.apply([Line("error", message)])


def finish_view(code: int) -> int:
    """The closing summary (rate, plan, logs, exit code); returns ``code``. No view: nothing."""
    global _SHOWN
    shown, _SHOWN = _SHOWN, None
    if shown is not None:
        shown.finish(code)
    return code


@atexit.register
def _stop_live() -> None:  # an exit that did not pass finish_view: leave the terminal tidy
    if _SHOWN is not None:
        _SHOWN.screen.close()


def _level_gate(threshold: int) -> structlog.typing.Processor:
    def gate(logger: Any, method: str, event_dict: structlog.typing.EventDict) -> Any:
        if _LEVELS.get(str(event_dict.get("level")), logging.CRITICAL) < threshold:
            raise structlog.DropEvent
        return event_dict

    return gate


def configure_logging(
    level: str = "info",
    stream: TextIO | None = None,
    json: bool | None = None,
    extra_processors: Sequence[structlog.typing.Processor] = (),
    *,
    view: TerminalView | None = None,
) -> None:
    """``json=None``: JSON lines off a terminal; on one, ``view`` if given, else the console."""
    global _SHOWN, _EVER_SHOWN
    out = stream if stream is not None else sys.stderr
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    if _SHOWN is not None:  # configured again (tests): the old view ends here
        _SHOWN.screen.close()
        _SHOWN = None
    tty = on_terminal(out)
    head: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if view is not None and json is None and (tty or view.force):
        _SHOWN = shown = _Shown(view, out, level)
        _EVER_SHOWN = True
        processors: list[structlog.typing.Processor] = [
            *head,
            shown.tap,  # the view sees info and up, whatever the level
            _level_gate(_LEVELS[level]),
            structlog.processors.format_exc_info,
            *extra_processors,
            shown.write,
        ]
        threshold = min(_LEVELS[level], logging.INFO)
    else:
        use_json = (not tty) if json is None else json
        renderer: structlog.typing.Processor = (
            structlog.processors.JSONRenderer()
            if use_json
            else structlog.dev.ConsoleRenderer(colors=tty)
        )
        processors = [
            *head,
            structlog.processors.format_exc_info,
            *extra_processors,  # e.g. the log shipper: after the timestamp, before rendering
            renderer,
        ]
        threshold = _LEVELS[level]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
