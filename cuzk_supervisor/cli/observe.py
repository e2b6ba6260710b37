"""Structured logging setup (structlog): JSON lines off a terminal, readable colour on one."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# Process-wide context (phase, uuid) added to every event. Not contextvars: tasks copy those when
# they are created, so a task started in one phase would report that phase for ever.
_CONTEXT: dict[str, object] = {}


def bind(**values: object) -> None:
    """Set process-wide fields carried by every later log event (e.g. phase, uuid)."""
    _CONTEXT.update(values)


def _add_context(
    logger: object, method_name: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    for key, value in _CONTEXT.items():
        event_dict.setdefault(key, value)
    return event_dict


def configure_logging(
    level: str = "info",
    stream: TextIO | None = None,
    json: bool | None = None,
    extra_processors: Sequence[structlog.typing.Processor] = (),
) -> None:
    """Configure structlog once for the process.

    ``json=None`` picks JSON lines unless ``stream`` is a terminal. Filtered-out levels cost one
    integer comparison (``make_filtering_bound_logger``).
    """
    out = stream if stream is not None else sys.stderr
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    use_json = (not out.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_context,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *extra_processors,  # e.g. the log shipper: after the timestamp, before rendering
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
