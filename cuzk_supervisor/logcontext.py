"""Process-wide fields (phase, uuid) carried by every later log event: set by the lifecycle,
added by a processor of the logging chain (:mod:`cuzk_supervisor.cli.observe`). Below both, so
that the lifecycle does not import the CLI.

Not contextvars: tasks copy those when they are created, so a task started in one phase would
report that phase for ever.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

_CONTEXT: dict[str, object] = {}


def bind(**values: object) -> None:
    """Set process-wide fields carried by every later log event (e.g. phase, uuid)."""
    _CONTEXT.update(values)


def add_context(
    logger: object, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The structlog processor that adds them (an event's own field wins)."""
    for key, value in _CONTEXT.items():
        event_dict.setdefault(key, value)
    return event_dict
