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

from cuzk_supervisor.settings.declare import CONFIG_FILE_ENV, ENV_PREFIX, GROUPS
from cuzk_supervisor.settings.show import format_value
from cuzk_supervisor.settings.values import Declared, declarations

SOURCES_TITLE = "settings sources"
SOURCES_HELP = (
    f"Each setting flag is also {ENV_PREFIX}<NAME> and a key of the settings file "
    f"({CONFIG_FILE_ENV}); flag > environment > file > default."
)

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
    """The flag's help: the setting's meaning, its choices and its default, in plain text."""
    default = format_value(decl, decl.default)
    choices = ", ".join(decl.choices) if decl.choices and decl.metavar else ""
    if default:
        tail = f"{choices}; default: {default}" if choices else f"default: {default}"
    elif "empty" in decl.help:  # the help says what empty means
        tail = choices
    else:
        tail = f"{choices}; default: none" if choices else "default: none"
    text = f"{decl.help} ({tail})" if tail else decl.help
    return plain(text).replace("%", "%%")


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
) -> None:
    """``--config-file`` and one flag per setting of ``groups`` and ``names``, less ``without``
    (see ``select``: ``add_flags(parser)`` is every setting), each in its group's section. The
    flags of ``unlisted`` are accepted too but left out of the help (the command says where
    they are documented): settings a command reads but that are not what it is about."""
    listed = select(groups, names, without)
    listed_names = {decl.name for decl in listed}
    quiet = [decl for decl in select((), unlisted) if decl.name not in listed_names]
    sources = parser.add_argument_group(SOURCES_TITLE, SOURCES_HELP if listed else None)
    sources.add_argument(
        "--config-file",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="TOML settings file",
    )
    sections: dict[str, argparse._ArgumentGroup] = {}
    for decl in listed:
        if decl.group not in sections:
            title = f"{decl.group} settings ({GROUPS[decl.group]})"
            sections[decl.group] = parser.add_argument_group(title)
        _add(sections[decl.group], decl, help_text(decl))
    for decl in quiet:
        _add(parser, decl, argparse.SUPPRESS)


def _add(container: argparse._ActionsContainer, decl: Declared, shown: str) -> None:
    if decl.kind == "bool":
        container.add_argument(
            decl.flag,
            dest=decl.name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=shown,
        )
    else:
        container.add_argument(
            decl.flag,
            dest=decl.name,
            default=argparse.SUPPRESS,
            metavar=metavar(decl),
            help=shown,
        )
