"""``[daemon] status_listen``: plain HTTP, as cuzk-daemon's ``main.rs`` answers it: a request
line that starts with ``GET /status`` gets the JSON (200, ``Access-Control-Allow-Origin: *``),
anything else a 404."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from cuzk_supervisor.address import Address
from cuzk_supervisor.deadline import within
from cuzk_supervisor.sim.daemon.chaos import HangGate

MAX_HEAD = 16 * 1024


async def start_status_server(
    address: Address, document: Callable[[], dict[str, Any]], gate: HangGate
) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await within(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        method, target = [*request_line, "", ""][:2]
        await gate.hold()
        extra = ""
        if f"{method} {target}".startswith("GET /status"):
            code, body, ctype = "200 OK", json.dumps(document()).encode(), "application/json"
            extra = "Access-Control-Allow-Origin: *\r\n"
        else:
            code, body, ctype = "404 Not Found", b"404 Not Found\n", "text/plain"
        writer.write(
            f"HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        writer.close()

    if address.path is not None:
        return await asyncio.start_unix_server(serve, path=str(address.path), limit=MAX_HEAD)
    return await asyncio.start_server(serve, address.host, address.port, limit=MAX_HEAD)
