"""Settings shown to people and programs: ``format_value`` (one line of text), ``json_value``
(the value with its type: numbers, booleans, lists, null), ``dump`` for ``config``, and the
configuration reference in docs/configuration.md (``markdown_table``). Secrets are redacted in
every one."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from cuzk_supervisor.settings.declare import GROUPS, REDACTED, redact_url
from cuzk_supervisor.settings.sources import Loaded
from cuzk_supervisor.settings.values import Declared, declarations

JsonValue = str | int | float | bool | list[str] | None


def format_value(decl: Declared, value: Any) -> str:
    """The value on one line, as ``config`` and help show it (redacted as ``json_value``)."""
    shown = json_value(decl, value)
    if shown is None:
        return ""
    if isinstance(shown, bool):
        return "true" if shown else "false"
    if isinstance(shown, list):
        return shlex.join(shown)
    return f"{shown:g}" if isinstance(shown, float) else str(shown)


def json_value(decl: Declared, value: Any) -> JsonValue:
    """The value as JSON keeps it: a number stays a number, a list a list, unset is null."""
    if decl.secret and value:
        return REDACTED
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, tuple):
        return [str(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if decl.name.endswith("_url") and value:
        return redact_url(str(value))
    return str(value)


def dump(loaded: Loaded) -> list[tuple[str, str, str]]:
    """(name, shown value, source) for every setting, secrets redacted."""
    return [
        (
            decl.name,
            format_value(decl, getattr(loaded.settings, decl.name)),
            loaded.sources[decl.name],
        )
        for decl in declarations()
    ]


def dump_json(loaded: Loaded) -> list[dict[str, Any]]:
    """``config --json``: name, typed value, source and group of every setting."""
    return [
        {
            "name": decl.name,
            "value": json_value(decl, getattr(loaded.settings, decl.name)),
            "source": loaded.sources[decl.name],
            "group": decl.group,
        }
        for decl in declarations()
    ]


def _meaning(decl: Declared) -> str:
    text = decl.help.replace("|", "\\|")
    if decl.choices:
        text += f" ({', '.join(decl.choices)})"
    if decl.minimum is not None or decl.maximum is not None:
        low = "" if decl.minimum is None else f"{decl.minimum:g}"
        high = "" if decl.maximum is None else f"{decl.maximum:g}"
        text += f"; range {low}–{high}"
    if decl.secret:
        text += "; secret: redacted in every dump"
    return text


def markdown_table() -> str:
    """The configuration reference (docs/configuration.md), one table per group, from the
    declarations."""
    lines: list[str] = []
    decls = declarations()
    for group, what in GROUPS.items():
        members = [decl for decl in decls if decl.group == group]
        if not members:
            continue
        if lines:
            lines.append("")
        lines += [
            f"**{group}**: {what}",
            "",
            "| setting | flag | environment | default | meaning |",
            "|---|---|---|---|---|",
        ]
        for decl in members:
            default = format_value(decl, decl.default) or "(empty)"
            lines.append(
                f"| `{decl.name}` | `{decl.flag}` | `{decl.env}` | `{default}` | {_meaning(decl)} |"
            )
    return "\n".join(lines)
