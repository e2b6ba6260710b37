"""What counts as the manager's answer (pure checks of an HTTP response).

A 2xx whose body is not the answer the API defines (reference/manager-api.md) is a
``BadAnswer``: a proxy's page, not the manager's word, retried like an outage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from cuzk_supervisor.adapters.manager.values import BadAnswer

__all__ = ["error_message", "json_body", "json_list", "json_object"]


def error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return error
    text = response.text.strip()
    return text[:200] if text else response.reason_phrase


def json_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadAnswer(response.status_code, "not JSON", response.content) from None


def json_object(response: httpx.Response, require: Mapping[str, type]) -> None:
    """The body is a JSON object with each required field of its type (bool is not an int)."""
    data = json_body(response)
    if not isinstance(data, dict):
        raise BadAnswer(response.status_code, "not a JSON object", response.content)
    if "ok" in require and data.get("ok") is not True:
        # param-done, running and bench-done answer {"ok": true, ...}; anything else (a proxy's
        # own JSON, {"ok": false}) is not the manager applying the report.
        raise BadAnswer(response.status_code, "no ok: true", response.content)
    for name, kind in require.items():
        value = data.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadAnswer(response.status_code, f"no {kind.__name__} {name}", response.content)
        if kind is str and not value:
            raise BadAnswer(response.status_code, f"empty {name}", response.content)


def json_list(response: httpx.Response) -> None:
    if not isinstance(json_body(response), list):
        raise BadAnswer(response.status_code, "not a JSON list", response.content)
