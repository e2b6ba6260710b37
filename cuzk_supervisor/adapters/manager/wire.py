"""The manager client's wire values: a request, an answer, the timeouts of one, the errors
that mean no answer came, and the transport seam (:class:`Transport`): the persistent HTTP/1.1
connection (:class:`~cuzk_supervisor.adapters.manager.http.HttpTransport`) or, in tests and the
simulators, :class:`FunctionTransport`, which answers from a function.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ConnectFailed",
    "Dropped",
    "FunctionTransport",
    "HttpAnswer",
    "HttpRequest",
    "TimedOut",
    "Timeouts",
    "Transport",
    "TransportError",
]


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 3.0
    write_s: float = 10.0
    read_s: float = 10.0
    """The whole answer, from the end of the request to its last byte."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str
    """The path and query, relative to the manager's base URL (``/running``)."""
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def of_json(cls, method: str, target: str, value: Any) -> HttpRequest:
        body = json.dumps(value, separators=(",", ":")).encode()
        return cls(method, target, (("Content-Type", "application/json"),), body)


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes = b""
    reason: str = ""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @classmethod
    def of_json(cls, status: int, value: Any, headers: Mapping[str, str] | None = None) -> Any:
        body = (json.dumps(value, separators=(",", ":")) + "\n").encode()
        merged = {"content-type": "application/json", **_lower(headers)}
        return cls(status, merged, body)

    @classmethod
    def of_text(
        cls, status: int, text: str, content_type: str = "text/plain; charset=utf-8",
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer:  # fmt: skip
        return cls(status, {"content-type": content_type, **_lower(headers)}, text.encode())


def _lower(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


class TransportError(Exception):
    """No answer came: the request may or may not have reached the manager."""


class ConnectFailed(TransportError):
    """The connection (or its TLS handshake) could not be made: refused, unreachable, DNS."""


class TimedOut(TransportError):
    def __init__(self, phase: str, seconds: float) -> None:
        self.phase = phase
        super().__init__(f"{phase} timed out after {seconds:g}s")


class Dropped(TransportError):
    """The connection was closed or reset, or what came back was not HTTP."""

    def __init__(self, message: str, *, answered: bool = True) -> None:
        self.answered = answered
        """False: closed before a byte of the answer came (the request may be written again)."""
        super().__init__(message)


class Transport(Protocol):
    async def send(self, request: HttpRequest, timeouts: Timeouts) -> HttpAnswer: ...

    async def aclose(self) -> None: ...


Handler = Callable[[HttpRequest], "HttpAnswer | Awaitable[HttpAnswer]"]


class FunctionTransport:
    """Answers every request with ``handler(request)`` (an answer, or an awaitable one; it may
    raise a :class:`TransportError`)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def send(self, request: HttpRequest, timeouts: Timeouts) -> HttpAnswer:
        result = self.handler(request)
        if inspect.isawaitable(result):
            result = await result
        assert isinstance(result, HttpAnswer)
        return result

    async def aclose(self) -> None:
        return None
