"""Validation of plain values, written once: a ``ValueError`` that names the owner, the field, the
rule and the value, e.g. ``RestartPolicy.jitter must be in [0, 1], got 1.5``.

Policies and settings values check themselves in ``__post_init__`` with these, so a bad value
fails where it is made, in words a person can act on. A :class:`Rule` is a small value (a test
and how it reads), in the manner of tenacity's strategies::

    require_fields(self, ("connect_s", "read_s"), POSITIVE)
    require_fields(self, ("max_workers",), int_at_least(1))
    require_value("effective_limit", "cgroup_limit_bytes", cgroup, int_above(0).or_none())
    require_relation(self, "backoff_max_s", ">=", "backoff_base_s")

Pure: no I/O.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

Comparison = Literal["<=", ">=", "<", ">"]

_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


def compares(value: Any, op: Comparison, bound: Any) -> bool:
    """``value op bound``, for ``op`` written as text (``">="``)."""
    return bool(_OPERATORS[op](value, bound))


def is_number(value: object) -> bool:
    """A finite int or float; bool is an int subclass, but True seconds is always a mistake."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Rule:
    """A test of one value, and the words that finish "must be ..." in the message."""

    test: Callable[[Any], Any]
    text: str

    def __call__(self, value: Any) -> bool:
        return bool(self.test(value))

    def or_none(self) -> Rule:
        """The same rule, with None allowed too."""
        return Rule(lambda v: v is None or self(v), f"None or {self.text}")


FINITE = Rule(is_number, "a finite number")
"""A finite int or float (not a bool, not NaN, not infinite)."""
POSITIVE = Rule(lambda v: v > 0, "> 0")
"""Greater than 0 (NaN is not); combine with FINITE for numbers from outside."""
NON_NEGATIVE = Rule(lambda v: v >= 0, ">= 0")
"""0 or more (NaN is not)."""


def int_at_least(minimum: int) -> Rule:
    return Rule(lambda v: is_int(v) and v >= minimum, f"an integer >= {minimum}")


def int_above(bound: int) -> Rule:
    return Rule(lambda v: is_int(v) and v > bound, f"an integer > {bound}")


def number_above(bound: float) -> Rule:
    return Rule(lambda v: is_number(v) and v > bound, f"a finite number > {bound:g}")


def number_at_least(minimum: float) -> Rule:
    return Rule(lambda v: is_number(v) and v >= minimum, f"a finite number >= {minimum:g}")


def in_range(low: float, high: float, *, high_open: bool = False) -> Rule:
    """``low <= value <= high`` (``< high`` with ``high_open``), written ``in [low, high]``."""
    if high_open:
        return Rule(lambda v: low <= v < high, f"in [{low:g}, {high:g})")
    return Rule(lambda v: low <= v <= high, f"in [{low:g}, {high:g}]")


def require(ok: bool, owner: str, name: str, value: object, rule: str) -> None:
    """Raise ``ValueError("{owner}.{name} must be {rule}, got {value!r}")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{owner}.{name} must be {rule}, got {value!r}")


def require_value(owner: str, name: str, value: object, rule: Rule) -> None:
    """``value`` (an argument ``name`` of ``owner``, e.g. a function) passes ``rule``."""
    require(rule(value), owner, name, value, rule.text)


def require_fields(obj: object, names: Iterable[str], rule: Rule) -> None:
    """Each named attribute of ``obj`` passes ``rule``; the owner is ``obj``'s class name."""
    owner = type(obj).__name__
    for name in names:
        require_value(owner, name, getattr(obj, name), rule)


def require_relation(obj: object, name: str, op: Comparison, other: str, why: str = "") -> None:
    """Attribute ``name`` of ``obj`` stands in relation ``op`` to attribute ``other``.
    ``require_relation(self, "backoff_max_s", ">=", "backoff_base_s")`` fails with
    ``ManagerRetry.backoff_max_s must be >= backoff_base_s (2.0), got 1.0``; ``why`` is added to the
    rule in the message."""
    value, bound = getattr(obj, name), getattr(obj, other)
    rule = f"{op} {other} ({bound})" + (f" {why}" if why else "")
    require(compares(value, op, bound), type(obj).__name__, name, value, rule)
