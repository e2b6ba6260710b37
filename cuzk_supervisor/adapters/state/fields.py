"""Typed access to the fields of a parsed JSON document, with error messages that name the
field (``state.bench[0].rate is str '1', expected a number``). The state document's reader
(:mod:`cuzk_supervisor.adapters.state.doc`) is built on it; anything wrong is a
:class:`StateFormatError`.
"""

from __future__ import annotations

from typing import Any


class StateFormatError(ValueError):
    """The state document is not one this build can read (the message says why)."""


class Fields:
    """Typed access to one JSON object's fields with error messages that name the field."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _bad(self, key: str, expected: str) -> StateFormatError:
        value = self.data.get(key)
        return StateFormatError(
            f"{self.where}.{key} is {type(value).__name__} {value!r:.60}, expected {expected}"
        )

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        if key not in self.data:
            if required:
                raise StateFormatError(f"{self.where}.{key} is missing")
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string or null")
        return value

    def opt_int(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._bad(key, "an integer or null")
        return value

    def opt_float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(key, "a number or null")
        return float(value)

    def number(self, key: str) -> float:
        value = self.opt_float(key)
        if value is None:
            raise self._bad(key, "a number")
        return value

    def integer(self, key: str) -> int:
        value = self.opt_int(key)
        if value is None:
            raise self._bad(key, "an integer")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def opt_bool(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, bool):
            raise self._bad(key, "true, false or null")
        return value

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            raise self._bad(key, "an object or null")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise self._bad(key, "a list")
        return value


def str_item(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise StateFormatError(f"{where} is {type(value).__name__}, expected a string")
    return value


def object_fields(value: Any, where: str) -> Fields:
    if not isinstance(value, dict):
        raise StateFormatError(f"{where} is {type(value).__name__}, expected an object")
    return Fields(value, where)
