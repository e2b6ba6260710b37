"""What an HTTP answer from the manager's URL is (:mod:`cuzk_supervisor.core.answers` decides,
this reads the body): the manager's answer, its word that the instance is gone
(:class:`InstanceGone`), its word that our request is wrong (:class:`ManagerRejected`), or
weather (:class:`Weather`, retried). A 2xx whose body is not the answer the API defines
(docs/manager-api.md) is a :class:`BadAnswer`: a proxy's page, weather too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cuzk_supervisor.adapters.manager.values import (
    BadAnswer,
    InstanceGone,
    ManagerRejected,
    Weather,
)
from cuzk_supervisor.adapters.manager.wire import HttpAnswer
from cuzk_supervisor.core.answers import Meaning, describe_answer, first_text_line, meaning
from cuzk_supervisor.core.backoff import parse_retry_after

__all__ = ["described", "json_body", "json_list", "json_object", "manager_error", "read_answer"]


def manager_error(answer: HttpAnswer) -> str | None:
    """The text of the manager's JSON error ``{"error": "<msg>"}`` (an object with that one
    field, as its handlers write it), or None when the body is anything else."""
    try:
        data = json.loads(answer.body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and len(data) == 1 and isinstance(data.get("error"), str):
        return str(data["error"])
    return None


def described(answer: HttpAnswer) -> str:
    """Who answered and how: status, ``Server`` header, the body's first line of text."""
    text = answer.body[:4096].decode("utf-8", "replace")
    return describe_answer(answer.status, answer.header("server"), first_text_line(text))


def read_answer(
    call: str, path: str, uuid: str | None, answer: HttpAnswer, now_wall: float
) -> HttpAnswer:
    """``answer`` when it is a 2xx; else raise what it means: InstanceGone, ManagerRejected
    (final: the manager's own word) or Weather (retried)."""
    error = manager_error(answer)
    kind = meaning(path, answer.status, error)
    if kind is Meaning.ANSWER:
        return answer
    if kind is Meaning.GONE:
        assert error is not None
        raise InstanceGone(call, uuid or "?", error)
    if kind is Meaning.REJECTED:
        assert error is not None
        raise ManagerRejected(call, answer.status, error)
    after = parse_retry_after(answer.header("retry-after"), now_wall)
    raise Weather(answer.status, described(answer), after)


def json_body(answer: HttpAnswer) -> Any:
    try:
        return json.loads(answer.body)
    except (ValueError, UnicodeDecodeError):
        raise BadAnswer(answer.status, "not JSON", answer.body) from None


def json_object(answer: HttpAnswer, require: Mapping[str, type]) -> dict[str, Any]:
    """The body as a JSON object with each required field of its type (bool is not an int)."""
    data = json_body(answer)
    if not isinstance(data, dict):
        raise BadAnswer(answer.status, "not a JSON object", answer.body)
    if "ok" in require and data.get("ok") is not True:
        # param-done, running and bench-done answer {"ok": true, ...}; anything else (a proxy's
        # own JSON, {"ok": false}) is not the manager applying the report.
        raise BadAnswer(answer.status, "no ok: true", answer.body)
    for name, kind in require.items():
        value = data.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadAnswer(answer.status, f"no {kind.__name__} {name}", answer.body)
        if kind is str and not value:
            raise BadAnswer(answer.status, f"empty {name}", answer.body)
    return data


def json_list(answer: HttpAnswer) -> list[Any]:
    data = json_body(answer)
    if not isinstance(data, list):
        raise BadAnswer(answer.status, "not a JSON list", answer.body)
    return data
