"""The one reader of the daemon's HTTP status (``[daemon] status_listen``, ``GET /status``).

Used by the bench's sampler (``statussampler``), ``prove``'s live line and its verdict, and the
step-down's count of partitions synthesizing. One transport: a short HTTP/1.0 request on the
event loop (no thread, no retries: the caller's next read is the retry), one size cap
(:data:`MAX_BODY_BYTES`), one timeout; the document is read by
:func:`cuzk_supervisor.core.boundsample.parse_status`. The daemon binds its status listener on
TCP only (cuzk-daemon's ``main.rs``: a unix path cannot bind, it logs an error and runs on
without it): a ``unix://`` address is no status (:func:`status_address`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.core.boundsample import StatusSample, parse_status
from cuzk_supervisor.deadline import within
from cuzk_supervisor.errors import UsageError

MAX_BODY_BYTES = 4 << 20
"""A listing of a few hundred failed jobs (each listed for the daemon's life) is ~1 MB."""
TIMEOUT_S = 1.0
REQUEST = b"GET /status HTTP/1.0\r\nHost: cuzk\r\nConnection: close\r\n\r\n"


def status_address(status_listen: str) -> Address | None:
    """The address to read, or None: empty, not an address, or a unix socket (module docstring)."""
    if not status_listen:
        return None
    try:
        address = parse_address(status_listen)
    except UsageError:
        return None
    return None if address.path is not None else address


async def fetch_status(
    address: Address, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BODY_BYTES
) -> object | None:
    """The ``/status`` JSON, or None (no answer in time, not 200, too big, not JSON)."""

    async def get() -> bytes:
        reader, writer = await asyncio.open_connection(address.host, address.port)
        try:
            writer.write(REQUEST)
            await writer.drain()
            raw = b""
            # HTTP/1.0 with Connection: close: the answer ends at EOF (one read() is one chunk)
            while chunk := await reader.read(65536):
                raw += chunk
                if len(raw) > max_bytes:
                    return b""
            return raw
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    try:
        raw = await within(get(), timeout_s)
    except (OSError, TimeoutError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


async def read_sample(
    address: Address | None, at: float, timeout_s: float = TIMEOUT_S
) -> StatusSample | None:
    """One answer as a sample stamped ``at`` (the caller's clock; no CPU, no NVML)."""
    if address is None:
        return None
    return parse_status(await fetch_status(address, timeout_s), at)


def synthesizing_now(status_listen: str, timeout_s: float = TIMEOUT_S) -> int | None:
    """The partitions synthesizing now, counted from their states (``synthesis.active`` counts
    failed syntheses forever); None when the daemon does not say. Blocking: for a caller off
    the event loop (the step-down reads it in a thread)."""
    sample = asyncio.run(read_sample(status_address(status_listen), 0.0, timeout_s))
    return None if sample is None else sample.synthesizing
