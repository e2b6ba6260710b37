"""The manager client's HTTP/1.1 transport on real sockets (issue 31): one connection kept open
while the server allows it, over TLS too; a new one when the server says ``Connection: close``,
after it closed an idle one, after the client's own idle expiry, after an error; answers by
``Content-Length``, chunked or to the end of the connection.

Each server here is a small asyncio one that counts the connections it accepted and answers
each request as the test says. No sleeps: every wait is for an answer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.http import HttpTransport
from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerUnavailable
from cuzk_supervisor.adapters.manager.wire import Dropped, HttpRequest, Timeouts

CERT = Path(__file__).parent / "fixtures" / "localhost-tls.pem"
FAST = ManagerRetry(backoff_base_s=0.001, backoff_max_s=0.005, report_stop_s=5.0)
OK = b'{"ok":true}\n'
LIMITS = Timeouts(5.0, 5.0, 5.0)

Answer = Callable[[int, bytes], bytes | None]
"""(request number on the server, request head) -> the raw answer (None: close at once)."""


def plain(body: bytes = OK, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


class Server:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests += 1
                raw = self.answer(self.requests, head)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                if b"Connection: close" in raw or b"HTTP/1.0" in raw[:8]:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(answer: Answer, tls: bool = False) -> AsyncIterator[tuple[Server, str]]:
    server = Server(answer)
    context = None
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(CERT)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        listener.close()
        for writer in server.writers:
            writer.close()


def trusting() -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(CERT))
    return context


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_one_connection_carries_every_call(tls):
    async with serving(lambda n, head: plain(), tls=tls) as (server, url):
        context = trusting() if tls else None
        async with ManagerClient(url, retry=FAST, ssl_context=context) as client:
            for _ in range(5):
                await client.running("u-1")
                await client.param_done("u-1")
            assert client.transport is not None
    assert server.requests == 10
    assert server.connections == 1


async def test_a_server_that_closes_gets_a_new_connection_each_time():
    closing = serving(lambda n, head: plain(extra="Connection: close\r\n"))
    async with closing as (server, url), ManagerClient(url, retry=FAST) as client:
        for _ in range(3):
            await client.running("u-1")
    assert (server.requests, server.connections) == (3, 3)


async def test_an_idle_connection_the_server_closed_is_replaced_without_a_failure():
    async with serving(lambda n, head: plain()) as (server, url):
        transport = HttpTransport(url)
        request = HttpRequest.of_json("POST", "/running", {"uuid": "u-1"})
        assert (await transport.send(request, LIMITS)).status == 200
        for writer in server.writers:  # the server times the idle connection out
            writer.close()
            await writer.wait_closed()
        assert (await transport.send(request, LIMITS)).status == 200
        await transport.aclose()
    assert (server.requests, server.connections) == (2, 2)


async def test_a_reused_connection_closed_before_the_answer_is_written_once_more():
    """The keep-alive race: the server closed the connection as we wrote on it. The request
    goes once more on a fresh connection, at once, not as a failed attempt."""

    def answer(n: int, head: bytes) -> bytes | None:
        return None if n == 2 else plain()

    async with serving(answer) as (server, url), ManagerClient(url, retry=FAST) as client:
        await client.running("u-1")
        await client.running("u-1")
        assert client.failures.failed == 0
    assert (server.requests, server.connections) == (3, 2)


async def test_a_fresh_connection_dropped_before_the_answer_is_a_failed_attempt():
    dropping = serving(lambda n, head: None if n == 1 else plain())
    async with dropping as (server, url), ManagerClient(url, retry=FAST) as client:
        await client.running("u-1")
        assert client.failures.failed == 1
    assert server.connections == 2


async def test_the_clients_idle_expiry_runs_on_the_injected_clock():
    now = [0.0]
    async with serving(lambda n, head: plain()) as (server, url):
        transport = HttpTransport(url, idle_s=230.0, clock=lambda: now[0])
        request = HttpRequest.of_json("POST", "/running", {"uuid": "u-1"})
        await transport.send(request, LIMITS)
        now[0] = 229.0
        await transport.send(request, LIMITS)
        now[0] = 229.0 + 230.0
        await transport.send(request, LIMITS)
        await transport.aclose()
        assert transport.opened == 2
    assert server.connections == 2


async def test_chunked_and_to_the_end_answers_are_read_whole():
    chunked = (b"HTTP/1.1 404 Not Found\r\nServer: nginx\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"6\r\n<html>\r\n7\r\n404 Not\r\n0\r\n\r\n")  # fmt: skip
    to_the_end = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK
    answers = {1: chunked, 2: to_the_end}
    async with serving(lambda n, head: answers.get(n, plain())) as (server, url):
        transport = HttpTransport(url)
        request = HttpRequest.of_json("POST", "/running", {"uuid": "u-1"})
        first = await transport.send(request, LIMITS)
        second = await transport.send(request, LIMITS)
        await transport.send(request, LIMITS)
        await transport.aclose()
    assert (first.status, first.body, first.header("Server")) == (404, b"<html>404 Not", "nginx")
    assert (second.status, second.body) == (200, OK)
    assert server.connections == 2  # HTTP/1.0 without keep-alive: closed after its answer


async def test_an_answer_that_is_not_http_is_a_dropped_connection():
    async with serving(lambda n, head: b"SSH-2.0-OpenSSH_9.6\r\n\r\n") as (_, url):
        transport = HttpTransport(url)
        with pytest.raises(Dropped, match="not an HTTP answer"):
            await transport.send(HttpRequest("GET", "/status"), LIMITS)
        await transport.aclose()


async def test_a_base_url_with_a_path_prefixes_every_request():
    heads: list[bytes] = []

    def answer(n: int, head: bytes) -> bytes:
        heads.append(head)
        return plain()

    async with serving(answer) as (_, url), ManagerClient(url + "/manager/", retry=FAST) as c:
        await c.running("u-1")
    assert heads[0].startswith(b"POST /manager/running HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_tls_to_a_server_we_do_not_trust_is_no_answer():
    async with serving(lambda n, head: plain(), tls=True) as (server, url):
        retry = ManagerRetry(backoff_base_s=0.001, backoff_max_s=0.005, report_stop_s=0.2)
        async with ManagerClient(url, retry=retry) as client:
            with capture_logs() as logs, pytest.raises(ManagerUnavailable):
                await client.running("u-1")
    assert server.requests == 0
    # The first failure is told (its reason: the certificate); the last attempt may be cut by
    # the call's stop on a loaded machine instead.
    away = next(e for e in logs if e["event"] == "manager.away")
    assert "CERTIFICATE_VERIFY_FAILED" in away["reason"]
