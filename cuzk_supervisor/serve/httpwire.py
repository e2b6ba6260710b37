"""The few lines of HTTP/1.1 the health server speaks: reading a request head (capped in
size; a client gone before sending one is :class:`ClientGone`) and writing one whole response
(``Connection: close``, never cached), plain or JSON.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

JSON_TYPE = "application/json"
# Request line and headers together; a probe or a scraper sends a few hundred bytes.
MAX_HEAD_BYTES = 8192


class ClientGone(Exception):
    """The client closed before sending a request."""


async def read_head(reader: asyncio.StreamReader) -> bytes | HTTPStatus:
    """The request head, or the error status to answer with."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ClientGone from None
        return HTTPStatus.BAD_REQUEST


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
