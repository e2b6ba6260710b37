"""The health server: ``/healthz`` (liveness), ``/startupz`` (slow start over), ``/readyz``
(readiness), ``/metrics`` (Prometheus).

A few lines of HTTP/1.1 over ``asyncio.start_server`` rather than a web framework: four GET
routes, one response per connection (``Connection: close``). It runs in the supervisor's event
loop, so an idle or slow client costs a parked task, never a blocked loop, and no client can
starve the probes:

- the request head has its own read deadline (``head_timeout_s``, 2 s: a probe sends its few
  hundred bytes at once) and a size cap; the whole exchange has a deadline too;
- connections are capped (``max_connections``); at the cap, a new connection evicts the oldest
  one that is still sending its head (a slow client is the one to go, not the probe that has just
  arrived), and only when every slot is busy answering is the new one refused;
- a client that disconnects early (before, during or after its request) is counted in
  ``cuzk_supervisor_health_connections_dropped_total{reason}``, never logged with a traceback.

The answers come from a ``HealthSource`` (phase, daemon readiness, last failure) and a
``SupervisorMetrics``, so the server is tested without a lifecycle. What the probes report is
:mod:`~cuzk_supervisor.serve.probes`, the HTTP framing :mod:`~cuzk_supervisor.serve.httpwire`, the
listen address and route names :mod:`~cuzk_supervisor.serve.endpoint`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import structlog

from cuzk_supervisor.serve.endpoint import ROUTES, HealthServerError, check_listen
from cuzk_supervisor.serve.httpwire import (
    MAX_HEAD_BYTES,
    ClientGone,
    head_arrived,
    http_response,
    json_response,
    read_head,
)
from cuzk_supervisor.serve.metrics import CONTENT_TYPE, SupervisorMetrics
from cuzk_supervisor.serve.probes import HEARTBEAT_INTERVAL_S, HealthSource, Heartbeat, StartupLatch

log = structlog.get_logger()

# After answering, read and drop at most this much of what the client still sends (a request
# body), so that closing does not turn unread bytes into a RST that can eat our response.
MAX_DRAIN_BYTES = 65536

# Connections the kernel queues before we accept them, whatever max_connections is: a queue only
# that deep (say 16) fills with a flood's reconnects, and the kubelet's SYN is dropped and sent
# again a second later, past the probe's 1 s timeout. Once accepted, the flood is evicted by age.
LISTEN_BACKLOG = 1024
# Connections accepted in one turn of the loop: few, so that a flood cannot hold the loop (the
# heartbeat, the answers) for a thousand accepts at a time.
ACCEPT_BATCH = 16


@dataclass(slots=True)
class _Connection:
    task: asyncio.Task[Any]
    transport: asyncio.WriteTransport
    since: float
    reading_head: bool = True
    evicted: bool = False


class HealthServer:
    """``async with HealthServer(listen, source, metrics) as server:`` serves until the block
    ends (or ``await start()`` ... ``await close()``; or ``await serve()`` as a task).

    ``refresh`` is called before each ``/metrics`` render, for gauges that are cheap to read at
    scrape time (e.g. the outbox depth); it must not block. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        listen: str,
        source: HealthSource,
        metrics: SupervisorMetrics,
        *,
        allow_public: bool = False,
        stale_after_s: float = 5.0,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        head_timeout_s: float = 2.0,
        request_timeout_s: float = 5.0,
        max_connections: int = 256,
        startup: StartupLatch | None = None,
        refresh: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_connections < 1 or head_timeout_s <= 0 or request_timeout_s <= 0:
            raise ValueError("max_connections, head_timeout_s and request_timeout_s must be > 0")
        self.host, self.port = check_listen(listen, allow_public=allow_public)
        self.source = source
        self.metrics = metrics
        self.stale_after_s = stale_after_s
        self.head_timeout_s = min(head_timeout_s, request_timeout_s)
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self.startup = startup if startup is not None else StartupLatch()
        self.heartbeat = Heartbeat(heartbeat_interval_s, clock)
        # Connections dropped without an answer, by reason (also in /metrics).
        self.dropped: Counter[str] = Counter()
        # After answering, how long to read what the client still sends before closing.
        self.linger_s = 1.0
        self._refresh = refresh
        self._server: asyncio.Server | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        # Insertion order is arrival order: the first one still reading its head is the oldest.
        self._connections: dict[asyncio.Task[Any], _Connection] = {}

    # --- lifetime ------------------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = await asyncio.start_server(
                self._on_connection,
                self.host,
                self.port,
                limit=MAX_HEAD_BYTES,
                backlog=ACCEPT_BATCH,
            )
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise HealthServerError(
                f"health server cannot listen on {self.url.removeprefix('http://')}: "
                f"{why or exc} "
                "(setting health_listen; health_enabled=false turns the server off)"
            ) from exc
        for listening in self._server.sockets:
            # A deeper kernel queue than asyncio's accept batch (it passes one number for both);
            # best effort: without it the server still serves, with the shallower queue.
            with contextlib.suppress(OSError), listening.dup() as same:
                same.listen(LISTEN_BACKLOG)
        self.port = int(self._server.sockets[0].getsockname()[1])  # the real one when 0 was asked
        self.heartbeat.beat()
        self._heartbeat_task = asyncio.create_task(self.heartbeat.run(), name="health-heartbeat")
        log.info("health.listening", url=self.url)

    async def close(self) -> None:
        """Stop listening, end open connections and the heartbeat; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = [*self._connections]
        if self._heartbeat_task is not None:
            tasks.append(self._heartbeat_task)
            self._heartbeat_task = None
        for task in tasks:
            task.cancel()
        # gather() of cancelled tasks: their CancelledError stays theirs, not ours.
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def serve(self) -> None:
        """Serve until cancelled (for a TaskGroup that owns the server as one of its tasks)."""
        await self.start()
        try:
            await asyncio.Future()
        finally:
            await self.close()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- one connection ------------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        self.metrics.health_connection_dropped(reason)

    def _make_room(self) -> bool:
        """At the cap: evict the oldest connection still sending its head. False if every slot
        is answering (then the newcomer is the one refused)."""
        for conn in self._connections.values():
            if conn.reading_head and not conn.evicted:
                conn.evicted = True
                del self._connections[conn.task]
                conn.transport.abort()
                conn.task.cancel()
                self._drop("evicted")
                return True
        return False

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.max_connections and not self._make_room():
            self._drop("refused")
            writer.transport.abort()  # every slot is answering: no work at all for this one
            return
        # A head already whole (a probe) is not evicted by the slow clients accepted after it
        # before the loop gets to read it.
        conn = _Connection(task, writer.transport, time.monotonic())
        conn.reading_head = not head_arrived(writer.transport)
        self._connections[task] = conn
        try:
            await self._exchange(reader, writer, conn)
        except asyncio.CancelledError:
            # close() cancels open connections, _make_room() an evicted one. This task is the
            # connection's own top-level task, awaited by nobody else; and 3.11's start_server
            # reports a cancelled one as an error in its done callback. So it ends normally.
            writer.transport.abort()
        except Exception:
            log.exception("health.request_crashed")
            writer.transport.abort()
        finally:
            self._connections.pop(task, None)
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # a client that stopped reading: do not wait on it
            writer.close()

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Connection
    ) -> None:
        try:
            async with asyncio.timeout(self.request_timeout_s):
                try:
                    async with asyncio.timeout(self.head_timeout_s):
                        head = await read_head(reader)
                except TimeoutError:
                    self._drop("head_timeout")
                    writer.transport.abort()
                    return
                conn.reading_head = False
                response = self._answer(head)
                writer.write(response)
                await writer.drain()
        except TimeoutError:
            # A client that does not read its answer.
            self._drop("timeout")
            writer.transport.abort()
            return
        except (ClientGone, OSError):
            # It left (FIN or RST) before it had its answer: nothing to log, only to count.
            self._drop("disconnect")
            writer.transport.abort()
            return
        # Lingering close: read what the client still sends (a body we did not want) until it
        # closes, briefly, so our close does not reset the connection before it read the answer.
        # A client gone by now got its answer (or does not care): OSError is the end, not news.
        with contextlib.suppress(TimeoutError, OSError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(self.linger_s):
                drained = 0
                while drained < MAX_DRAIN_BYTES:
                    chunk = await reader.read(4096)
                    if not chunk:
                        break
                    drained += len(chunk)

    def _answer(self, head: bytes | HTTPStatus) -> bytes:
        if head is HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
            return http_response(head, b"request head too large\n")
        if isinstance(head, HTTPStatus):
            return http_response(head, b"incomplete request\n")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return http_response(HTTPStatus.BAD_REQUEST, b"bad request line\n")
        method, target, _ = parts
        if method != "GET":
            return http_response(
                HTTPStatus.METHOD_NOT_ALLOWED, b"only GET\n", extra={"Allow": "GET"}
            )
        path = target.split("?", 1)[0]
        if path == "/healthz":
            return self._healthz()
        if path == "/startupz":
            return self._startupz()
        if path == "/readyz":
            return self._readyz()
        if path == "/metrics":
            return self._metrics()
        return http_response(HTTPStatus.NOT_FOUND, f"not found: try {', '.join(ROUTES)}\n".encode())

    # --- routes --------------------------------------------------------------------------------

    def _healthz(self) -> bytes:
        lag = self.heartbeat.lag_s()
        ok = lag <= self.stale_after_s
        body: dict[str, Any] = {
            "ok": ok,
            "loop_lag_s": round(lag, 3) if lag != float("inf") else None,
        }
        if not ok:
            body["reason"] = f"event loop heartbeat late by more than {self.stale_after_s:g}s"
        return json_response(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)

    def _startupz(self) -> bytes:
        phase = self.source.phase
        if self.startup.passed:
            return json_response(HTTPStatus.OK, {"started": True, "phase": phase})
        body = {
            "started": False,
            "phase": phase,
            "reason": f"slow start not over: in phase {phase}; passes once the daemon answered "
            "after warmup (params, plan and warmup done)",
            "last_failure": self.source.last_failure,
        }
        return json_response(HTTPStatus.SERVICE_UNAVAILABLE, body)

    def _readyz(self) -> bytes:
        phase = self.source.phase
        daemon_ready = self.source.daemon_ready
        # The run phase's health watch, where the source has one: broken is not ready.
        health = getattr(self.source, "health", None)
        said = health if health and health.get("level") != "healthy" else None
        if phase == "run" and daemon_ready and not (said and said.get("level") == "broken"):
            ready: dict[str, Any] = {"phase": phase, "daemon_ready": True}
            return json_response(HTTPStatus.OK, {**ready, "health": said} if said else ready)
        body = {
            "phase": phase,
            "daemon_ready": daemon_ready,
            "last_failure": self.source.last_failure,
            **({"health": said} if said else {}),
        }
        return json_response(HTTPStatus.SERVICE_UNAVAILABLE, body)

    def _metrics(self) -> bytes:
        if self._refresh is not None:
            try:
                self._refresh()
            except Exception:  # stale gauges beat no metrics at all
                log.exception("health.metrics_refresh_failed")
        return http_response(HTTPStatus.OK, self.metrics.render(), content_type=CONTENT_TYPE)
