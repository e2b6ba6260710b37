"""From the declarations to values: ``declarations()``, and ``parse_value`` for one raw value.

A raw value (a flag's or a variable's text, a TOML value) becomes the setting's typed value and
is held to its limits and text rules; a bad one is a ``UsageError`` naming the setting, the value
(cut short, or left out when secret), where it came from and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import shlex
import types
import typing
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cuzk_supervisor.address import parse_address
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings.declare import ENV_PREFIX, MAX_LIST_ITEMS, MAX_RAW_CHARS, REDACTED
from cuzk_supervisor.settings.fields import Settings


@dataclass(frozen=True, slots=True)
class Declared:
    name: str
    kind: str  # str, int, float, bool, path, optional_path, list
    default: Any
    help: str
    secret: bool
    choices: tuple[str, ...] | None
    minimum: float | None
    maximum: float | None
    group: str
    form: str | None = None
    max_length: int = 4096
    metavar: str | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _kind(hint: Any) -> str:
    if hint is bool:
        return "bool"
    if hint in (int, float, str):
        return hint.__name__
    if hint is Path:
        return "path"
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union) and Path in typing.get_args(hint):
        return "optional_path"
    if origin is tuple:
        return "list"
    raise TypeError(f"unsupported setting type {hint!r}")


def declarations() -> list[Declared]:
    """Every setting, in the order of ``Settings`` (group by group)."""
    return list(_declarations())


@functools.cache
def _declarations() -> tuple[Declared, ...]:
    hints = typing.get_type_hints(Settings)
    # A field's metadata is the rest of its Declared (``declare.setting``).
    return tuple(
        Declared(name=f.name, kind=_kind(hints[f.name]), default=f.default, **f.metadata)
        for f in dataclasses.fields(Settings)
    )


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _allowed(decl: Declared) -> str:
    if decl.choices:
        return "one of " + ", ".join(decl.choices)
    limits = []
    if decl.minimum is not None:
        limits.append(f">= {decl.minimum:g}")
    if decl.maximum is not None:
        limits.append(f"<= {decl.maximum:g}")
    noun = {
        "bool": "true or false",
        "int": "an integer",
        "float": "a number",
        "path": "a path",
        "optional_path": "a path or empty",
        "list": "a list (TOML array, or a shell-quoted string)",
        "str": "text",
    }[decl.kind]
    return noun + (" " + " and ".join(limits) if limits else "")


def _shown(decl: Declared, value: Any) -> str:
    """A value as an error shows it: redacted when secret, one line, at most ~60 characters."""
    if decl.secret:
        return REDACTED
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _bad(decl: Declared, value: Any, source: str, why: str | None = None) -> UsageError:
    shown = _shown(decl, value)
    reason = why or f"must be {_allowed(decl)}"
    return UsageError(f"setting {decl.name} = {shown} (from {source}): {reason}")


def _raw_problem(decl: Declared, raw: Any) -> str | None:
    """Checks on the raw value, before it is parsed: size and encoding."""
    texts: list[str] = []
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list | tuple):
        if len(raw) > MAX_LIST_ITEMS:
            return f"a list of {len(raw)} items, more than {MAX_LIST_ITEMS}"
        texts = [item for item in raw if isinstance(item, str)]
    if sum(len(text) for text in texts) > MAX_RAW_CHARS:
        return f"longer than {MAX_RAW_CHARS} characters"
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a non-UTF-8 byte, kept by Python as a lone surrogate
            return "not valid UTF-8"
    return None


def parse_value(decl: Declared, raw: Any, source: str) -> Any:
    """Text (flag, env) or a TOML value → the setting's typed value, checked against limits."""
    problem = _raw_problem(decl, raw)
    if problem is not None:
        # Not shown: an undecodable or huge value does not belong in a one-line error.
        raise UsageError(f"setting {decl.name} (from {source}): {problem}")
    try:
        value = _convert(decl, raw)
    except (ValueError, TypeError):
        raise _bad(decl, raw, source) from None
    if decl.choices and value not in decl.choices:
        raise _bad(decl, raw, source)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _bad(decl, raw, source)
        if decl.minimum is not None and value < decl.minimum:
            raise _bad(decl, raw, source)
        if decl.maximum is not None and value > decl.maximum:
            raise _bad(decl, raw, source)
    problem = _value_problem(decl, value)
    if problem is not None:
        if problem.startswith(f"bad {decl.name} "):  # already a whole line naming the setting
            raise UsageError(problem)
        raise _bad(decl, raw, source, problem)
    return value


# --- text rules -------------------------------------------------------------------------------

_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*")
_LOG_FILTER_RE = re.compile(r"[A-Za-z][A-Za-z0-9_:=,.-]*")
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # visible ASCII: a header value, no space, no CR/LF


def _control(text: str) -> bool:
    """A control character (newline, tab, NUL, escape, DEL, C1) or a line/paragraph separator."""
    return any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text)


def _path_problem(path: Path) -> str | None:
    text = str(path)
    if _control(text):
        return "a path without control characters"
    if text.startswith("-"):
        return "a path, not starting with '-'"
    if any(len(part.encode()) > 255 for part in path.parts):
        return "a path whose names are at most 255 bytes"
    return None


def _form_problem(form: str, text: str) -> str | None:
    """Why ``text`` breaks the rule ``form`` (None when it keeps it). Empty text is checked
    by the caller (each form says whether it may be empty)."""
    if form == "label":
        if not _LABEL_RE.fullmatch(text):
            return "letters, digits and . _ : @ + - (starting with a letter or digit)"
    elif form == "url":
        return _url_problem(text)
    elif form == "token":
        if not _TOKEN_RE.fullmatch(text):
            return "visible ASCII characters (no spaces, no newlines)"
    elif form in ("address", "optional_address"):
        try:
            parse_address(text)
        except UsageError as exc:
            return str(exc)
    elif form == "health_listen":
        from cuzk_supervisor.serve.endpoint import parse_listen

        try:
            parse_listen(text)
        except UsageError as exc:
            return str(exc)
    elif form == "log_filter":
        if not _LOG_FILTER_RE.fullmatch(text):
            return "a log level or filter: letters, digits and _ : = , . -"
    elif form in ("program", "command"):
        if text.strip().startswith("-"):
            return "a command, not starting with '-'"
        if not text.strip():
            return "a command, not blank"
    elif form == "expected_file":
        name, sep, size = text.rpartition(":")
        if not sep or not size.isdigit() or not name:
            return "NAME:BYTES"
        if "/" in name or name in (".", "..") or name.startswith("-"):
            return "NAME:BYTES with NAME a plain file name"
        if int(size) > 1 << 40:
            return "NAME:BYTES with BYTES at most 1 TiB"
    return None


def _url_problem(text: str) -> str | None:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError:
        return "an http(s) URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http(s) URL"
    if any(ch.isspace() for ch in text):
        return "an http(s) URL without spaces"
    return None


_MAY_BE_EMPTY = {None, "label", "url", "token", "optional_address", "command"}


def _value_problem(decl: Declared, value: Any) -> str | None:
    """The text rules: every text without control characters and within its length; each form
    its own rule."""
    if decl.kind == "path":
        return _path_problem(value)
    if decl.kind == "optional_path":
        return None if value is None else _path_problem(value)
    if decl.kind == "list":
        items: tuple[str, ...] = value
        for item in items:
            if _control(item):
                return "a list of texts without control characters (newlines, tabs, NUL)"
            if len(item) > decl.max_length:
                return f"a list of texts of at most {decl.max_length} characters each"
            if decl.form is not None:
                problem = _form_problem(decl.form, item)
                if problem is not None:
                    return f"a list, each item {problem}"
        return None
    if decl.kind != "str" or decl.choices:
        return None
    text: str = value
    if _control(text):
        return "text without control characters (newlines, tabs, NUL)"
    if len(text) > decl.max_length:
        return f"text of at most {decl.max_length} characters"
    if not text:
        return None if decl.form in _MAY_BE_EMPTY else "not empty"
    return None if decl.form is None else _form_problem(decl.form, text)


def _convert(decl: Declared, raw: Any) -> Any:
    kind = decl.kind
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(raw)
    if kind == "int":
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError(raw)
        return int(str(raw).strip()) if not isinstance(raw, int | float) else int(raw)
    if kind == "float":
        if isinstance(raw, bool):
            raise ValueError(raw)
        return float(raw)
    # Text settings take text only: a TOML number, date or table is not a label or a path.
    if kind == "path":
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(raw)
        return Path(raw)
    if kind == "optional_path":
        if not isinstance(raw, str):
            raise TypeError(raw)
        return Path(raw) if raw.strip() else None
    if kind == "list":
        if isinstance(raw, list | tuple):
            if not all(isinstance(item, str) for item in raw):
                raise TypeError(raw)
            return tuple(raw)
        if not isinstance(raw, str):
            raise TypeError(raw)
        return tuple(shlex.split(raw))
    if not isinstance(raw, str):
        raise TypeError(raw)
    return raw
