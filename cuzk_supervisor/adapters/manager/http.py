"""HTTP/1.1 to the manager over one persistent connection, on the standard library's asyncio
streams (no HTTP library: a run-phase supervisor holds one connection and sends a request a
minute; httpx and its dependencies cost about 7 MiB of RSS and 119 modules for that).

- **One connection per manager, kept open** (keep-alive) while the server allows it: a fleet
  behind a TLS front does not pay a TCP and TLS handshake per report. Requests take turns on
  it (a lock); the answer is read whole before the next request is written.
- A connection is closed and replaced when the server said ``Connection: close`` (or spoke
  HTTP/1.0 without keep-alive), after any error or a cancelled exchange (its state is then
  unknown), once the server closed it (seen before reuse), and after ``idle_s`` without a
  request on the injected clock: shorter than the idle timeouts of the NATs and load balancers
  between a cloud instance and its manager (4 to 6 minutes), which drop a connection silently.
- A request on a reused connection that the server closed before a byte of its answer came back
  (a keep-alive race: the server timed the connection out as we wrote) is written once more on
  a fresh connection, at once; anything else is the caller's to retry.
- Every phase is bounded (:class:`Timeouts`): connecting (with the TLS handshake), writing, and
  reading the whole answer. A timeout, a refused connection or a dropped one raises a
  :class:`TransportError`: no answer.
- An answer is read by its ``Content-Length``, as chunks, or to the end of the connection, at
  most ``max_body`` bytes. The values and the ``transport=`` seam are in ``wire``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cuzk_supervisor.adapters.manager.wire import (
    ConnectFailed,
    Dropped,
    FunctionTransport,
    HttpAnswer,
    HttpRequest,
    TimedOut,
    Timeouts,
    Transport,
    TransportError,
)

__all__ = [
    "IDLE_S",
    "ConnectFailed",
    "Dropped",
    "FunctionTransport",
    "HttpAnswer",
    "HttpRequest",
    "HttpTransport",
    "TimedOut",
    "Timeouts",
    "Transport",
    "TransportError",
]

IDLE_S = 230.0
"""A connection idle this long is closed before the next request (see the module docstring)."""
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
USER_AGENT = "cuzk-supervisor"


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class HttpTransport:
    """One persistent HTTP/1.1 connection to ``base_url`` (``http://`` or ``https://``; a path
    in it prefixes every request). ``ssl_context`` for ``https`` (default: the system's CA
    store, made at the first connection); ``clock`` times the idle expiry. Counts what it
    does: :attr:`opened` connections, :attr:`bytes_out` and :attr:`bytes_in` (HTTP bytes,
    before TLS)."""

    def __init__(
        self,
        base_url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        max_body: int = MAX_BODY,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        default = 443 if self.tls else 80
        self.port = url.port or default
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        self.prefix = url.path.rstrip("/")
        self._ssl = ssl_context
        self.idle_s = idle_s
        self._clock = clock
        self.max_body = max_body
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self.opened = 0
        self.bytes_out = 0
        self.bytes_in = 0

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.usable()

    def local_port(self) -> int | None:
        """The local port of the open connection (the fleet benchmark matches it with its
        proxy's records); None when none is open."""
        if self._conn is None:
            return None
        name = self._conn.writer.get_extra_info("sockname")
        return int(name[1]) if name else None

    async def send(self, request: HttpRequest, timeouts: Timeouts) -> HttpAnswer:
        async with self._lock:
            conn = self._conn
            self._conn = None
            now = self._clock()
            if conn is not None and (not conn.usable() or now - conn.used_at >= self.idle_s):
                conn.close()
                conn = None
            reused = conn is not None
            if conn is None:
                conn = await self._open(timeouts)
            try:
                try:
                    answer, keep = await self._exchange(conn, request, timeouts)
                except Dropped as exc:
                    conn.close()
                    if not reused or exc.answered:
                        raise
                    conn = await self._open(timeouts)
                    answer, keep = await self._exchange(conn, request, timeouts)
            except BaseException:
                conn.close()
                raise
            if keep:
                conn.used_at = self._clock()
                self._conn = conn
            else:
                conn.close()
            return answer

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _open(self, timeouts: Timeouts) -> _Connection:
        context: ssl.SSLContext | None = None
        if self.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(timeouts.connect_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=context, limit=MAX_HEAD,
                    server_hostname=self.host if context is not None else None,
                )  # fmt: skip
        except TimeoutError:
            raise TimedOut("connect", timeouts.connect_s) from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        self.opened += 1
        return _Connection(reader, writer, self._clock())

    async def _exchange(
        self, conn: _Connection, request: HttpRequest, timeouts: Timeouts
    ) -> tuple[HttpAnswer, bool]:
        data = self._encode(request)
        try:
            async with asyncio.timeout(timeouts.write_s):
                conn.writer.write(data)
                await conn.writer.drain()
        except TimeoutError:
            raise TimedOut("write", timeouts.write_s) from None
        except OSError as exc:
            raise Dropped(f"{type(exc).__name__} while writing: {exc}", answered=False) from None
        self.bytes_out += len(data)
        try:
            async with asyncio.timeout(timeouts.read_s):
                return await self._read(conn.reader, request.method)
        except TimeoutError:
            raise TimedOut("read", timeouts.read_s) from None

    def _encode(self, request: HttpRequest) -> bytes:
        lines = [f"{request.method} {self.prefix}{request.target} HTTP/1.1",
                 f"Host: {self.host_header}", f"User-Agent: {USER_AGENT}"]  # fmt: skip
        lines += [f"{name}: {value}" for name, value in request.headers]
        if request.body or request.method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(request.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body

    async def _read(self, reader: asyncio.StreamReader, method: str) -> tuple[HttpAnswer, bool]:
        while True:
            head = await self._head(reader)
            status, reason, version, headers = _parse_head(head)
            if not 100 <= status < 200:
                break  # an interim answer (103 Early Hints) comes before the real one
        keep = _keep_alive(version, headers.get("connection", ""))
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._chunked(reader)
        elif "content-length" in headers:
            length = _int(headers["content-length"], "Content-Length")
            if length > self.max_body:
                raise Dropped(f"an answer of {length} bytes (at most {self.max_body})")
            body = await self._exactly(reader, length)
        else:
            body = await reader.read(self.max_body + 1)
            while len(body) <= self.max_body and not reader.at_eof():
                more = await reader.read(self.max_body + 1 - len(body))
                if not more:
                    break
                body += more
            self.bytes_in += len(body)
            keep = False
        return HttpAnswer(status, headers, body, reason), keep

    async def _head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise Dropped("closed before an answer", answered=bool(exc.partial)) from None
        except asyncio.LimitOverrunError:
            raise Dropped(f"an answer's head over {MAX_HEAD} bytes") from None
        except OSError as exc:
            raise Dropped(f"{type(exc).__name__}: {exc}", answered=False) from None
        self.bytes_in += len(head)
        return head

    async def _exactly(self, reader: asyncio.StreamReader, size: int) -> bytes:
        try:
            data = await reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise Dropped(f"closed after {len(exc.partial)} of {size} bytes") from None
        except OSError as exc:
            raise Dropped(f"{type(exc).__name__}: {exc}") from None
        self.bytes_in += size
        return data

    async def _chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = await self._line(reader)
            size = _int(line.split(b";", 1)[0].strip().decode("latin-1"), "chunk size", 16)
            if size == 0:
                while (await self._line(reader)).strip():
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > self.max_body:
                raise Dropped(f"a chunked answer over {self.max_body} bytes")
            parts.append(await self._exactly(reader, size))
            await self._line(reader)

    async def _line(self, reader: asyncio.StreamReader) -> bytes:
        try:
            line = await reader.readuntil(b"\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            raise Dropped(f"bad chunked answer: {type(exc).__name__}") from None
        self.bytes_in += len(line)
        return line


def _int(text: str, what: str, base: int = 10) -> int:
    try:
        value = int(text.strip(), base)
    except ValueError:
        raise Dropped(f"bad {what} {text[:20]!r}") from None
    if value < 0:
        raise Dropped(f"bad {what} {text[:20]!r}")
    return value


def _parse_head(head: bytes) -> tuple[int, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise Dropped(f"not an HTTP answer: {lines[0][:40]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", parts[0], headers


def _keep_alive(version: str, connection: str) -> bool:
    tokens = {t.strip().lower() for t in connection.split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens
