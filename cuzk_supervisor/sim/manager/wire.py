"""A request to the simulated manager and its answer, written as the real (Go) manager writes
them: JSON as Go's encoder (compact, Go's numbers, a trailing newline), errors as
``{"error": msg}``, Go's plain-text ``http.Error`` (405, 404), ``/sim/``'s own plain JSON, and
the real ``tail`` rule (Go's ``strconv.Atoi``).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from cuzk_supervisor.sim.manager.gojson import BadJSON, go_dumps


@dataclass(slots=True)
class Request:
    method: str
    path: str  # decoded, as Go's r.URL.Path
    query: dict[str, list[str]]
    headers: Any  # email.message.Message
    body: bytes
    connection: socket.socket | None = None
    raw_query: str = ""

    def param(self, name: str) -> str:
        values = self.query.get(name)
        return values[0] if values else ""


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


def json_response(status: int, value: Any) -> Response:
    """As Go's json.Encoder writes it: compact, Go's numbers, a trailing newline."""
    return Response(status, (go_dumps(value) + "\n").encode(), "application/json")


def sim_response(status: int, value: Any) -> Response:
    """A ``/sim/`` answer: plain Python JSON (the sim's own, not the real API)."""
    body = (json.dumps(value, separators=(",", ":")) + "\n").encode()
    return Response(status, body, "application/json")


def ok() -> Response:
    return json_response(200, {"ok": True})


def error(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def bad_request(exc: BadJSON) -> Response:
    return error(400, f"bad request: {exc}")


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """As Go's http.Error writes it."""
    merged = {"X-Content-Type-Options": "nosniff", **(headers or {})}
    return Response(status, text.encode(), "text/plain; charset=utf-8", merged)


def method_not_allowed() -> Response:
    """The real handlers' own method check: ``http.Error(w, "method not allowed", 405)``."""
    return text_response(405, "method not allowed\n")


def not_found() -> Response:
    return text_response(404, "404 page not found\n")


def decode_json(body: bytes) -> Any:
    """The first JSON value of ``body`` as plain Python (for the journal); BadJSON if none."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise BadJSON("EOF")
    try:
        value, _end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise BadJSON(exc.msg) from None
    return value


def go_bool(value: bool) -> str:
    return "true" if value else "false"


def go_atoi_positive(text: str, default: int) -> int:
    """``strconv.Atoi(text)`` when it is > 0, else ``default`` (the real ``tail`` rule)."""
    if re.fullmatch(r"[+-]?\d+", text):
        value = int(text)
        if 0 < value < 2**63:
            return value
    return default
