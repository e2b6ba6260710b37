"""JSON as the real (Go) manager reads and writes it, for the simulated manager.

Writing is ``json.NewEncoder(w).Encode(v)``: compact, a trailing newline, numbers as Go prints
a ``float64`` (``30``, not ``30.0``; ``1e+21`` and ``1e-7`` beyond the fixed range), ``<``, ``>``,
``&``, U+2028 and U+2029 escaped, other non-ASCII text as is.

Reading is ``json.NewDecoder(r.Body).Decode(&req)`` into a struct: the first JSON value only
(anything after it ignored), field names matched exactly and then case-insensitively, ``null``
leaving the zero value, unknown keys ignored, and Go's error texts (``EOF``, ``unexpected
EOF``, ``invalid character 'x' looking for beginning of value``, ``json: cannot unmarshal string
into Go struct field RegisterReq.min_rate of type float64``).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

GO_TYPES = {str: "string", float: "float64", int: "int"}
_INT_RE = re.compile(r"-?(?:0|[1-9]\d*)")
_LITERALS = ("true", "false", "null")


class BadJSON(ValueError):
    """A body Go's decoder rejects; the message is Go's error text."""


# --- writing --------------------------------------------------------------------------------
def go_float(value: float) -> str:
    """A float64 as Go's encoding/json writes it."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    magnitude = abs(value)
    if 1e-6 <= magnitude < 1e21:
        return format(Decimal(repr(value)).normalize(), "f")
    text = repr(value)  # shortest digits, as Go's 'e' format with precision -1
    if re.search(r"e-0\d$", text):  # Go cleans e-07 up to e-7 (but keeps e+21)
        text = text[:-2] + text[-1]
    return text


def _go_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        out = out.replace(char, escaped)
    return out


def go_dumps(value: Any) -> str:
    """``value`` (dicts in their order, lists, str, int, float, bool, None) as Go writes it,
    without the trailing newline."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, dict):
        items = (f"{_go_string(str(k))}:{go_dumps(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_dumps(item) for item in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


# --- reading --------------------------------------------------------------------------------
class _Number(str):
    """A JSON number as written, kept as text so an error can quote it as Go does."""


def _reject_constant(name: str) -> Any:
    raise BadJSON(f"invalid character {name[0]!r} looking for beginning of value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_Number, parse_int=_Number)


def _quote_char(char: str) -> str:
    """A character as Go's decoder quotes it in an error."""
    if char == "'":
        return "'\\''"
    if char == '"':
        return "'\"'"
    return repr(char) if char.isprintable() else json.dumps(char).replace('"', "'")


def _syntax_error(text: str, exc: json.JSONDecodeError) -> BadJSON:
    pos = exc.pos
    if pos >= len(text):
        return BadJSON("unexpected EOF")
    char = text[pos]
    for literal in _LITERALS:
        if char == literal[0]:
            for offset, expected in enumerate(literal[1:], start=1):
                if pos + offset >= len(text):
                    return BadJSON("unexpected EOF")
                if text[pos + offset] != expected:
                    found = _quote_char(text[pos + offset])
                    return BadJSON(
                        f"invalid character {found} in literal {literal} (expecting {expected!r})"
                    )
    where = {
        "Expecting value": "looking for beginning of value",
        "Expecting property name enclosed in double quotes": (
            "looking for beginning of object key string"
        ),
        "Expecting ':' delimiter": "after object key",
        "Expecting ',' delimiter": "after object key:value pair",
    }.get(exc.msg, "looking for beginning of value")
    return BadJSON(f"invalid character {_quote_char(char)} {where}")


def _kind(value: Any, target: type | None = None) -> str:
    """How Go names a JSON value in a type error (a number's text only for a number field)."""
    if isinstance(value, _Number):
        return f"number {value}" if target in (int, float) else "number"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def first_value(body: bytes) -> Any:
    """The first JSON value of ``body`` (numbers as :class:`_Number` text)."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise BadJSON("EOF")
    try:
        value, _end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise _syntax_error(text, exc) from None
    return value


def decode_struct(body: bytes, struct: str, fields: dict[str, type]) -> dict[str, Any]:
    """Decode ``body`` into Go struct ``struct`` with ``fields`` (name → str, float or int).
    Missing and ``null`` fields are absent from the result. ``struct`` is "" for an anonymous
    struct (Go then names the field ``.name``)."""
    value = first_value(body)
    if value is None:
        return {}
    if not isinstance(value, dict):
        found = _kind(value).split(" ")[0]
        target = f"main.{struct}" if struct else "struct { ... }"
        raise BadJSON(f"json: cannot unmarshal {found} into Go value of type {target}")
    out: dict[str, Any] = {}
    first_error: BadJSON | None = None
    for name, kind in fields.items():
        key = name if name in value else None
        if key is None:
            matches = [k for k in value if k.lower() == name]
            key = matches[-1] if matches else None
        if key is None or value[key] is None:
            continue
        item = value[key]
        converted = _convert(item, kind)
        if converted is None:
            if first_error is None:
                first_error = BadJSON(
                    f"json: cannot unmarshal {_kind(item, kind)} into Go struct field "
                    f"{struct}.{name} of type {GO_TYPES[kind]}"
                )
            continue
        out[name] = converted
    if first_error is not None:  # Go decodes the rest, then reports the first type error
        raise first_error
    return out


def _convert(item: Any, kind: type) -> Any:
    """``item`` as ``kind``, or None when Go would refuse it."""
    if kind is str:
        return str(item) if isinstance(item, str) and not isinstance(item, _Number) else None
    if not isinstance(item, _Number):
        return None
    if kind is float:
        number = float(item)
        return None if math.isinf(number) else number
    if not _INT_RE.fullmatch(item):
        return None
    number = int(item)
    return number if -(2**63) <= number < 2**63 else None
