"""The simulated manager's request handler: reads one request (a body by length or chunked,
64 MiB at most), asks the fault switches (``faults``: an outage, a proxy's page or
reset, a throttle, a bad body, latency), routes it (``routes``) unless faulted, answers
as Go's server does (keep-alive, no ``Server`` header), and records it in the journal and the
counters with the bytes it cost both ways.
"""

from __future__ import annotations

import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.counters import REPORT_PATHS
from cuzk_supervisor.sim.manager.faults import (
    ERROR_KIND,
    OUTAGE_MESSAGE,
    PROXY_KIND,
    THROTTLE_KIND,
    Decision,
)
from cuzk_supervisor.sim.manager.gojson import BadJSON
from cuzk_supervisor.sim.manager.listener import ManagerHTTPServer
from cuzk_supervisor.sim.manager.proxy import RESET, reset_on_close, retry_after_value
from cuzk_supervisor.sim.manager.records import JournalEntry, split_log_body
from cuzk_supervisor.sim.manager.routes import endpoint_of, route
from cuzk_supervisor.sim.manager.wire import Request, Response, decode_json, error

MAX_BODY = 64 * 1024 * 1024  # a body larger than this is refused with 413 (the sim's limit)
JSON_PATHS = (
    "/register",
    "/param-done",
    "/bench-done",
    "/running",
    "/bad-host",
    "/api/kill",
    "/sim/kill",
    "/api/deploy",
)


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Counting:
    """A file-like wrapper that counts the bytes read from or written to the socket."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._inner.read(size)
        self.count += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self._inner.readline(size)
        self.count += len(data)
        return data

    def write(self, data: bytes) -> int:
        written: int = self._inner.write(data)
        self.count += len(data)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ManagerRequestHandler(BaseHTTPRequestHandler):
    """Reads one request, asks the fault switches, routes, answers, records it."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Go's server
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK
    server: ManagerHTTPServer
    _in_mark = 0  # bytes read from the connection before this request's line
    _out_mark = 0  # bytes written to it before this request's answer

    def setup(self) -> None:
        super().setup()
        self.rfile = _Counting(self.rfile)  # type: ignore[assignment]
        self.wfile = _Counting(self.wfile)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        self._in_mark = self._read_count()
        super().handle_one_request()

    def _read_count(self) -> int:
        rfile: Any = self.rfile
        return int(rfile.count)

    def _written_count(self) -> int:
        wfile: Any = self.wfile
        return int(wfile.count)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_GET

    def send_response(self, code: int, message: str | None = None) -> None:
        """Status line and Date, and no Server header (Go's server sends none)."""
        self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.verbose:
            super().log_message(format, *args)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            raise BodyError(400, "bad Content-Length") from None
        if length < 0:
            raise BodyError(400, "bad Content-Length")
        if length > MAX_BODY:
            raise BodyError(413, "request body too large")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BodyError(400, "bad chunk size") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise BodyError(413, "request body too large")
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)  # the CRLF after the chunk

    def _handle(self) -> None:
        app: App = self.server.app
        received = time.time()
        start = time.monotonic()
        url = urlsplit(self.path)
        entry = JournalEntry(
            seq=app.journal.next_seq(),
            ts=received,
            method=self.command,
            path=url.path,
            query=url.query,
            sim=url.path == "/sim" or url.path.startswith("/sim/"),
            log_source=self.headers.get("X-Log-Source"),
            instance_uuid=self.headers.get("X-Instance-UUID"),
        )
        try:
            body = self._read_body()
        except BodyError as exc:
            self.close_connection = True
            response = error(exc.status, str(exc))
            response.close = True
            try:
                self._answer(response)
                entry.answered = True
            finally:
                entry.status = response.status
                entry.duration = time.monotonic() - start
                app.journal.record(entry)
                self._count(app, entry, body=b"")
            return
        entry.body_bytes = len(body)
        if url.path in JSON_PATHS:
            try:
                entry.json = decode_json(body)
            except BadJSON:
                entry.json = None
        req = Request(
            self.command,
            unquote(url.path),
            parse_qs(url.query),
            self.headers,
            body,
            self.connection,
            url.query,
        )
        decision = Decision() if entry.sim else app.faults.decide(url.path)
        if decision.kind == PROXY_KIND and decision.body == RESET:
            self._reset(app, entry, start, body)
            return
        if decision.delay_before > 0:
            time.sleep(decision.delay_before)
        if decision.apply:
            try:
                response = route(app, req)
            except Exception:  # a bug answers 500, the server lives on
                traceback.print_exc(file=sys.stderr)
                response = error(500, "internal error")
            entry.applied = True
            if url.path == "/api/log-push" and response.status == 204:
                entry.lines_stored = len(split_log_body(body))
        if decision.fail:
            entry.faulted = True
            entry.fault = decision.kind
            if decision.kind == ERROR_KIND:
                response = error(decision.status, OUTAGE_MESSAGE)
            else:
                status, canned, content_type = decision.response()
                response = Response(status, canned, content_type, decision.headers())
                if decision.kind == THROTTLE_KIND:
                    value = retry_after_value(
                        decision.retry_after_form, decision.retry_after, time.time()
                    )
                    if value is not None:
                        response.headers["Retry-After"] = value
        if decision.delay_after > 0:
            time.sleep(decision.delay_after)
        entry.status = response.status
        try:
            self._answer(response)
            entry.answered = True
        finally:
            entry.duration = time.monotonic() - start
            app.journal.record(entry)
            self._count(app, entry, body)

    def _reset(self, app: App, entry: JournalEntry, start: float, body: bytes) -> None:
        """A proxy's reset: the connection dropped (RST), nothing answered, nothing applied."""
        entry.faulted, entry.fault, entry.status = True, RESET, 0
        self.close_connection = True
        reset_on_close(self.connection)
        entry.duration = time.monotonic() - start
        app.journal.record(entry)
        self._count(app, entry, body)

    def _count(self, app: App, entry: JournalEntry, body: bytes) -> None:
        """The request in the counters (not a ``/sim/`` one): its bytes both ways, how it was
        answered; a report answered 2xx as applied for its uuid."""
        if entry.sim:
            return
        app.counters.record(
            endpoint_of(entry.path),
            status=entry.status,
            bytes_in=self._read_count() - self._in_mark,
            bytes_out=self._written_count() - self._out_mark,
            faulted=entry.faulted,
            throttled=entry.fault == THROTTLE_KIND,
            applied=entry.applied,
        )
        if entry.applied and entry.path in REPORT_PATHS and 200 <= entry.status < 300:
            uuid = entry.json.get("uuid") if isinstance(entry.json, dict) else None
            if isinstance(uuid, str):
                app.counters.report_applied(entry.path, uuid)

    def _answer(self, response: Response) -> None:
        self._out_mark = self._written_count()
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if response.content_type is not None:
            self.send_header("Content-Type", response.content_type)
        if response.status != 204:
            self.send_header("Content-Length", str(len(response.body)))
        if response.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD" and response.status != 204:
            self.wfile.write(response.body)
        self.wfile.flush()
