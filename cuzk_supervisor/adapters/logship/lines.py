"""Log events as lines for the manager's dashboard: :func:`event_to_line` renders one
structlog event as one readable line, and :func:`shipping_processor` is the structlog processor
that feeds every event to a :class:`~cuzk_supervisor.adapters.logship.shipper.LogShipper` (under
:data:`SUPERVISOR_SOURCE`, the supervisor's own tab). Pure apart from handing the line over.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, Protocol

from cuzk_supervisor.core.lineclass import event_is_milestone


class LineTaker(Protocol):
    """What the processor and a child's tab (``childtab.ChildTab``) hand lines to: the
    ``shipper.LogShipper``, named here so that the shipper imports them and not both ways."""

    def add_line(
        self, source: str, line: str, *, milestone: bool = False, kind: str = ""
    ) -> int | None: ...

    def promote(self, source: str, seqs: Iterable[int]) -> None: ...


SUPERVISOR_SOURCE = "setup"
"""The dashboard tab for the supervisor's own lines (the old scripts sent theirs as `setup`)."""

NOT_SHIPPED = frozenset({"child.line"})
"""Events never shipped as supervisor lines: a ``child.line`` event carries one line of a
child's output, and that line is already shipped raw under the child's own tab (``cuzk``,
``benchdaemon``, ``curio``, ``setup`` for the fetch) by its output pump's sink. Shipping the
event too sent every daemon line twice (issue 22)."""


_HEAD_KEYS = ("timestamp", "level", "event")
BOUND_KEYS = frozenset({"uuid"})
"""Fields bound to every event once the instance is registered: a tab is the instance's own, so
its lines leave them out (a third of a short line), but where the event is about them
(``manager.registered``, ``manager.new_instance``)."""
_ABOUT_BOUND = frozenset({"manager.registered", "manager.new_instance"})


SHIPPED_NESTED_CHARS = 160
"""A structured field (a list, a mapping: a command line, the bench's whole measurement) is
detail: a shipped line carries its first this many characters and how long it was; the local
log keeps it whole. A phase's milestones then fit its budget even in a short run (the bench's
result alone was 2.9 KB of a 12 KB/min budget)."""


def _fmt_value(value: Any, nested_chars: int | None = None) -> str:
    if isinstance(value, str):
        if value and not any(c in value for c in ' "=\n\r\t'):
            return value
        return json.dumps(value, ensure_ascii=False)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    if nested_chars is not None and len(text) > nested_chars:
        return f"{text[:nested_chars]}…[{len(text):,} chars]"
    return text


def event_to_line(
    event_dict: Mapping[str, Any],
    omit: frozenset[str] = frozenset(),
    nested_chars: int | None = None,
) -> str:
    """One structlog event as one readable line: ``<timestamp> <level> <event> key=value ...``
    (without the fields ``omit``; a structured value longer than ``nested_chars`` cut there)."""
    parts = [str(event_dict[key]) for key in _HEAD_KEYS if event_dict.get(key) is not None]
    parts.extend(
        f"{key}={_fmt_value(value, nested_chars)}"
        for key, value in event_dict.items()
        if key not in _HEAD_KEYS and key not in omit and not key.startswith("_")
    )
    return " ".join(parts)


def shipping_processor(
    shipper: LineTaker, source: str = SUPERVISOR_SOURCE
) -> Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]:
    """A structlog processor feeding every event but :data:`NOT_SHIPPED` to ``shipper``, a
    milestone or a routine line by its level and name (``lineclass.event_is_milestone``), its
    kind the event's name; the event passes unchanged. Put it after ``add_log_level`` and
    ``TimeStamper`` and before the renderer."""

    def processor(
        logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event = str(event_dict.get("event"))
        if event in NOT_SHIPPED:
            return event_dict
        # Logging must never fail because of shipping.
        with contextlib.suppress(Exception):
            milestone = event_is_milestone(event, str(event_dict.get("level", method_name)))
            omit = frozenset() if event in _ABOUT_BOUND else BOUND_KEYS
            line = event_to_line(event_dict, omit, SHIPPED_NESTED_CHARS)
            shipper.add_line(source, line, milestone=milestone, kind=event)
        return event_dict

    return processor
