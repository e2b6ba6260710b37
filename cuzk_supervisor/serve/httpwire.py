"""The few lines of HTTP/1.1 the health server speaks: reading a request head (capped in
size; a client gone before sending one is :class:`ClientGone`) and writing one whole response
(``Connection: close``, never cached), plain or JSON.
"""

from __future__ import annotations

import asyncio
import json
import socket
from http import HTTPStatus
from typing import Any

JSON_TYPE = "application/json"
# Request line and headers together; a probe or a scraper sends a few hundred bytes.
MAX_HEAD_BYTES = 8192
HEAD_END = b"\r\n\r\n"


class ClientGone(Exception):
    """The client closed before sending a request."""


async def read_head(reader: asyncio.StreamReader) -> bytes | HTTPStatus:
    """The request head, or the error status to answer with."""
    try:
        return await reader.readuntil(HEAD_END)
    except asyncio.LimitOverrunError:
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ClientGone from None
        return HTTPStatus.BAD_REQUEST


def head_arrived(transport: asyncio.BaseTransport) -> bool:
    """Whether a whole request head already waits in the connection's socket (peeked, not
    read): a probe sends its head at once, a slow client never has all of it."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with sock.dup() as same:
            waiting = same.recv(MAX_HEAD_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing yet (EAGAIN), or gone: not a head
        return False
    return HEAD_END in waiting


def json_response(status: HTTPStatus, body: dict[str, Any]) -> bytes:
    return http_response(status, json.dumps(body).encode() + b"\n", content_type=JSON_TYPE)


def http_response(
    status: HTTPStatus,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: dict[str, str] | None = None,
) -> bytes:
    headers = {
        "Content-Type": content_type,
        "Content-Length": str(len(body)),
        "Cache-Control": "no-store",
        "Connection": "close",
        **(extra or {}),
    }
    head = f"HTTP/1.1 {status.value} {status.phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return head.encode("latin-1") + b"\r\n" + body
