"""Settings as command-line flags: ``add_flags`` gives a command the groups of settings it reads.

Each setting is one flag (``--max-workers N``; a boolean is ``--x``/``--no-x``), in an argument
group named after its settings group, with a metavar that says what the value is and its default
in plain text. A flag left unset stays absent from the namespace, so the environment, the file
and the default show through (``sources.from_namespace``). Values are parsed by ``load``, not by
argparse, so a bad one is the same one-line error from a flag, a variable or the file.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from typing import Any

from cuzk_supervisor.settings.declare import CONFIG_FILE_ENV, GROUPS
from cuzk_supervisor.settings.show import format_value
from cuzk_supervisor.settings.values import Declared, declarations

SOURCES_TITLE = "settings sources"
FIRST_TITLE = "what a fleet sets (every other setting has a default that fits the field)"
SOURCES_HELP = f"flag > environment > settings file ({CONFIG_FILE_ENV}) > default."

_FORM_METAVARS = {
    "url": "URL",
    "token": "TOKEN",
    "address": "ADDR",
    "optional_address": "ADDR",
    "health_listen": "ADDR",
    "label": "LABEL",
    "log_filter": "FILTER",
    "program": "PROGRAM",
    "command": "COMMAND",
}
_FLOAT_SUFFIXES = {"_s": "SECONDS", "_gib": "GIB", "_fraction": "FRACTION", "_scale": "FACTOR"}


def plain(text: str) -> str:
    """reST markup left out for a terminal: ``literal`` and `role` become literal and role."""
    return re.sub(r"``(.+?)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), text)


def metavar(decl: Declared) -> str:
    """What the value is, in capitals: N, SECONDS, GIB, DIR, FILE, ADDR, URL, {a,b,c} …"""
    if decl.metavar is not None:
        return decl.metavar
    if decl.choices:
        return "{" + ",".join(decl.choices) + "}"
    if decl.kind == "int":
        return "BYTES" if decl.name.endswith("_bytes") else "N"
    if decl.kind == "float":
        suffix = next((s for s in _FLOAT_SUFFIXES if decl.name.endswith(s)), None)
        return _FLOAT_SUFFIXES[suffix] if suffix else "NUMBER"
    if decl.kind in ("path", "optional_path"):
        return "DIR" if decl.name.endswith(("_dir", "_cache", "_root")) else "FILE"
    if decl.kind == "list":
        return "LIST"
    return _FORM_METAVARS.get(decl.form or "", "TEXT")


def help_text(decl: Declared) -> str:
    """The flag's help: the setting's meaning, then in one form for every flag its choices (where
    the metavar does not list them), its default (``empty`` when there is none) and its
    environment variable, in plain text."""
    parts = [f"one of {', '.join(decl.choices)}"] if decl.choices and decl.metavar else []
    parts += [f"default: {format_value(decl, decl.default) or 'empty'}", f"env: {decl.env}"]
    return plain(f"{decl.help} ({'; '.join(parts)})").replace("%", "%%")


def select(
    groups: Iterable[str] | None = None, names: Iterable[str] = (), without: Iterable[str] = ()
) -> list[Declared]:
    """The settings in ``groups`` or ``names``, less ``without``; ``groups`` None is every group
    when no names are given, else none."""
    chosen_names, left_out = set(names), set(without)
    if groups is None:
        groups = () if chosen_names else GROUPS
    chosen_groups = set(groups)
    decls = declarations()
    known = {decl.name for decl in decls}
    unknown = (chosen_groups - set(GROUPS)) | ((chosen_names | left_out) - known)
    if unknown:
        raise ValueError(f"unknown settings group or setting: {', '.join(sorted(unknown))}")
    return [
        decl
        for decl in decls
        if (decl.group in chosen_groups or decl.name in chosen_names) and decl.name not in left_out
    ]


def add_flags(
    parser: argparse.ArgumentParser,
    groups: Iterable[str] | None = None,
    *,
    names: Iterable[str] = (),
    without: Iterable[str] = (),
    unlisted: Iterable[str] = (),
    first: Iterable[str] = (),
) -> None:
    """``--config-file`` and one flag per setting of ``groups`` and ``names``, less ``without``
    (see ``select``: ``add_flags(parser)`` is every setting), each in its group's section; those
    of ``first`` (the few a fleet sets) together in a section of their own before the others.
    The flags of ``unlisted`` are accepted too but left out of the help (the command says where
    they are documented): settings a command reads but that are not what it is about."""
    listed = select(groups, names, without)
    leading = list(first)
    if set(leading) - {decl.name for decl in listed}:
        raise ValueError(f"first names a setting not listed: {', '.join(leading)}")
    listed_names = {decl.name for decl in listed}
    quiet = [decl for decl in select((), unlisted) if decl.name not in listed_names]
    sources = parser.add_argument_group(SOURCES_TITLE, SOURCES_HELP if listed else None)
    sources.add_argument(
        "--config-file", default=argparse.SUPPRESS, metavar="FILE", help="TOML settings file"
    )
    sections: dict[str, argparse._ArgumentGroup] = {}
    if leading:
        sections[FIRST_TITLE] = parser.add_argument_group(FIRST_TITLE)
    rank = {name: i for i, name in enumerate(leading)}
    for decl in sorted(listed, key=lambda d: rank.get(d.name, len(rank))):  # stable: the rest
        section = FIRST_TITLE if decl.name in leading else decl.group
        if section not in sections:
            title = f"{decl.group} settings ({GROUPS[decl.group]})"
            sections[section] = parser.add_argument_group(title)
        _add(sections[section], decl, help_text(decl))
    for decl in quiet:
        _add(parser, decl, argparse.SUPPRESS)


def _add(container: argparse._ActionsContainer, decl: Declared, shown: str) -> None:
    if decl.kind == "bool":
        how: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
    else:
        how = {"metavar": metavar(decl)}
    container.add_argument(decl.flag, dest=decl.name, default=argparse.SUPPRESS, help=shown, **how)
