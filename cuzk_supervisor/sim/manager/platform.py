"""The platform's instance list (``vastai show instances --raw``, or ``--instances FILE``) and
how the real manager matches a record against it: by the platform label first, then by the
id in a ``C.<digits>`` label.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

VAST_LABEL_RE = re.compile(r"C\.([+-]?\d+)")  # what Go's strconv.Atoi takes after "C."


def vast_id_from_label(label: str) -> int | None:
    """The platform instance id in a ``C.<digits>`` label, as the real manager reads it."""
    match = VAST_LABEL_RE.fullmatch(label)
    if match is None:
        return None
    value = int(match.group(1))
    return value if -(2**63) <= value < 2**63 else None


@dataclass(frozen=True, slots=True)
class PlatformInstance:
    """One instance of the platform's list (``vastai show instances``): its id, its label
    on the platform (often empty), the machine it runs on."""

    id: int
    label: str = ""
    machine_id: int | None = None


@dataclass(frozen=True, slots=True)
class Platform:
    """The platform's instance list, matched as the real manager matches a record: by the
    platform label first, then by the id in a ``C.<digits>`` label."""

    entries: tuple[PlatformInstance, ...]

    def find(self, label: str) -> PlatformInstance | None:
        for entry in self.entries:
            if entry.label and entry.label == label:
                return entry
        vast_id = vast_id_from_label(label)
        if vast_id is not None:
            for entry in self.entries:
                if entry.id == vast_id:
                    return entry
        return None


def parse_platform(text: str) -> Platform:
    """The platform's instance list: a JSON array of instances as ``vastai show instances
    --raw`` prints them (objects with ``id``, and ``label`` and ``machine_id`` where known;
    other keys ignored) or of bare instance ids. ValueError, with the reason, otherwise."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("expected a JSON array of instances")
    entries: list[PlatformInstance] = []
    for n, item in enumerate(raw):
        if isinstance(item, int) and not isinstance(item, bool):
            entries.append(PlatformInstance(item))
            continue
        if not isinstance(item, dict):
            raise ValueError(f"item {n}: expected an object or an instance id")
        ident, label, machine = item.get("id"), item.get("label"), item.get("machine_id")
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise ValueError(f"item {n}: 'id' must be an integer")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"item {n}: 'label' must be a string or null")
        if machine is not None and (not isinstance(machine, int) or isinstance(machine, bool)):
            raise ValueError(f"item {n}: 'machine_id' must be an integer or null")
        entries.append(PlatformInstance(ident, label or "", machine))
    return Platform(tuple(entries))
