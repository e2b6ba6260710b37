"""The health server over real loopback sockets, with a fake source and an injectable clock.

No fixed sleeps synchronise anything: a stale heartbeat comes from the fake clock (or from
blocking the loop on purpose), and waits are for events (EOF on a socket, a condition polled
with a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import structlog
from pacehelpers import patient
from prometheus_client.parser import text_string_to_metric_families

from cuzk_supervisor.adapters.machine.gpu import GpuDevice
from cuzk_supervisor.core.exits import ExitKind
from cuzk_supervisor.core.risk import RiskLevel
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.lifecycle.machine import LifecycleSource
from cuzk_supervisor.serve.endpoint import HealthServerError, check_listen, parse_listen
from cuzk_supervisor.serve.health import HealthServer
from cuzk_supervisor.serve.metrics import CONTENT_TYPE, SupervisorMetrics
from cuzk_supervisor.serve.probes import Heartbeat, StartupLatch

GIB = 1 << 30


@dataclass
class FakeSource:
    phase: str = "start"
    daemon_ready: bool = False
    last_failure: str = ""


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def source() -> FakeSource:
    return FakeSource()


@pytest.fixture
def metrics() -> SupervisorMetrics:
    return SupervisorMetrics()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def server(source, metrics, clock) -> AsyncIterator[HealthServer]:
    async with HealthServer("127.0.0.1:0", source, metrics, clock=clock) as running:
        yield running


@pytest.fixture
async def client(server) -> AsyncIterator[httpx.AsyncClient]:
    # trust_env=False: a proxy from the environment must not stand between us and loopback.
    async with httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http:
        yield http


async def wait_until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + patient(within_s)
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def wait_until_answered(
    http: httpx.AsyncClient, path: str, status: int, within_s: float
) -> None:
    """Until ``GET path`` answers ``status`` (a deadline only a hang reaches, not a sleep)."""
    deadline = time.monotonic() + patient(within_s)
    while (await http.get(path)).status_code != status:
        assert time.monotonic() < deadline, f"{path} never answered {status}"
        await asyncio.sleep(0.02)


# --- /healthz -----------------------------------------------------------------------------------


async def test_healthz_is_ok_while_the_heartbeat_is_fresh(client):
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["connection"] == "close"
    body = response.json()
    assert body["ok"] is True
    assert body["loop_lag_s"] == 0


async def test_healthz_is_503_when_the_heartbeat_is_stale_and_recovers(server, client, clock):
    clock.advance(10)  # the last beat now looks 10 s old
    response = await client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["ok"] is False
    assert body["loop_lag_s"] == pytest.approx(10 - server.heartbeat.interval_s)
    assert "late" in body["reason"]
    # The next beat is itself that late (see the Heartbeat test); the one after is on time.
    # The real heartbeat task may beat in between too, which changes nothing here.
    server.heartbeat.beat()
    server.heartbeat.beat()
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["loop_lag_s"] == 0


async def test_healthz_sees_a_loop_that_was_blocked(source, metrics):
    beat_s, stale_s, blocked_s = 0.5, 0.3, 1.0
    async with (
        HealthServer(
            "127.0.0.1:0", source, metrics, heartbeat_interval_s=beat_s, stale_after_s=stale_s
        ) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        assert (await http.get("/healthz")).status_code == 200
        # A probe sent while the loop is blocked waits in the kernel: it is the first thing the
        # loop serves when it turns again, within the heartbeat interval after the block (the
        # next beat on time would clear the lag). Arranged, not raced: the block lasts until
        # the probe is sent, then blocked_s more.
        sent = threading.Event()
        answer: list[bytes] = []

        def probe() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                sent.set()
                while chunk := sock.recv(65536):
                    answer.append(chunk)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        # The thing under test: a blocking call in the event loop.
        assert sent.wait(60)
        time.sleep(blocked_s)  # noqa: ASYNC251
        await asyncio.to_thread(prober.join, 60)
        head, _, body = b"".join(answer).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), head
        # Not a margin: whether the late beat ran first or not, the lag it reports is at least
        # the block less one interval (a slow machine only adds to it).
        assert json.loads(body)["loop_lag_s"] >= blocked_s - beat_s
        # Once the loop turns freely again the heartbeat catches up.
        await wait_until_answered(http, "/healthz", 200, within_s=30)


def test_heartbeat_lag_with_a_fake_clock():
    clock = FakeClock(0.0)
    beat = Heartbeat(0.5, clock)
    assert beat.lag_s() == float("inf")  # never beat: not alive
    beat.beat()
    clock.advance(0.5)
    assert beat.lag_s() == 0
    clock.advance(2.0)
    assert beat.lag_s() == pytest.approx(2.0)  # overdue now
    beat.beat()
    assert beat.lag_s() == pytest.approx(2.0)  # that beat was late
    clock.advance(0.5)
    beat.beat()
    assert beat.lag_s() == 0


# --- /readyz ------------------------------------------------------------------------------------


async def test_readyz_flips_with_phase_and_daemon_readiness(source, client):
    source.phase = "bench"
    source.daemon_ready = True
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"phase": "bench", "daemon_ready": True, "last_failure": ""}

    source.phase = "run"
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"phase": "run", "daemon_ready": True}

    source.daemon_ready = False
    source.last_failure = "daemon oom_killed: killed by the kernel OOM killer"
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "phase": "run",
        "daemon_ready": False,
        "last_failure": "daemon oom_killed: killed by the kernel OOM killer",
    }

    source.daemon_ready = True
    assert (await client.get("/readyz")).status_code == 200


# --- /startupz ----------------------------------------------------------------------------------


def test_startup_latch_passes_after_warmup_and_never_turns_back():
    latch = StartupLatch()
    for phase in ("start", "register", "params", "plan", "warmup"):
        latch.on_phase(phase)
        assert latch.passed is False, phase
    latch.on_phase("settle")  # the daemon answered proofs after warmup
    assert latch.passed is True
    latch.on_phase("plan")  # a later step down re-plans: the slow start stays over
    assert latch.passed is True
    for phase in ("restart", "bench", "report", "run"):
        fresh = StartupLatch()
        fresh.on_phase(phase)
        assert fresh.passed is True, phase  # a resumed supervisor enters "run" directly


async def test_startupz_is_503_with_the_reason_until_the_slow_start_is_over(source, metrics):
    latch = StartupLatch()
    async with (
        HealthServer("127.0.0.1:0", source, metrics, startup=latch) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        source.phase = "warmup"
        latch.on_phase("warmup")
        response = await http.get("/startupz")
        assert response.status_code == 503
        body = response.json()
        assert body["started"] is False
        assert body["phase"] == "warmup"
        assert "slow start not over: in phase warmup" in body["reason"]
        assert (await http.get("/healthz")).status_code == 200  # alive all the same

        source.phase = "restart"
        latch.on_phase("restart")
        response = await http.get("/startupz")
        assert response.status_code == 200
        assert response.json() == {"started": True, "phase": "restart"}
        assert (await http.get("/readyz")).status_code == 503  # started is not ready


def test_lifecycle_source_reads_the_lifecycle_at_request_time():
    keeper = SimpleNamespace(is_ready=False)
    lifecycle = SimpleNamespace(
        progress=SimpleNamespace(phase="warmup"), keeper=None, last_failure=""
    )
    view = LifecycleSource(lifecycle)  # type: ignore[arg-type]
    assert (view.phase, view.daemon_ready, view.last_failure) == ("warmup", False, "")
    lifecycle.keeper = keeper
    lifecycle.progress.phase = "run"
    lifecycle.last_failure = "daemon crashed: exit 101"
    assert (view.phase, view.daemon_ready) == ("run", False)
    keeper.is_ready = True
    assert view.daemon_ready is True
    assert view.last_failure == "daemon crashed: exit 101"


# --- /metrics -----------------------------------------------------------------------------------


async def test_metrics_shows_what_the_typed_methods_set(metrics, client):
    metrics.set_phase("bench")
    metrics.daemon_exit(ExitKind.OOM_KILLED)
    metrics.proof_finished(True, 42.0)
    metrics.proof_finished(False, 3.0)
    metrics.bench_rate(55.5)
    metrics.memory(7 * GIB, RiskLevel.CRITICAL)
    metrics.gpus([GpuDevice(0, "NVIDIA H200", "GPU-0", 141 * GIB, 20 * GIB, 121 * GIB)])
    metrics.outbox_depth(2)

    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }

    def at(sample: str, /, **labels: str) -> float:
        return samples[(sample, frozenset(labels.items()))]

    assert at("cuzk_supervisor_up") == 1
    assert at("cuzk_supervisor_start_time_seconds") > 0
    assert at("cuzk_supervisor_phase", phase="bench") == 1
    assert at("cuzk_supervisor_phase", phase="start") == 0
    assert at("cuzk_supervisor_daemon_exits_total", kind="oom_killed") == 1
    assert at("cuzk_supervisor_daemon_exits_total", kind="crashed") == 0
    assert at("cuzk_supervisor_proofs_completed_total") == 1
    assert at("cuzk_supervisor_proofs_failed_total") == 1
    assert at("cuzk_supervisor_proof_duration_seconds_count") == 1
    assert at("cuzk_supervisor_proof_duration_seconds_sum") == 42.0
    assert at("cuzk_supervisor_bench_rate_proofs_per_hour") == 55.5
    assert at("cuzk_supervisor_memory_headroom_bytes") == 7 * GIB
    assert at("cuzk_supervisor_oom_risk_level") == 2
    assert at("cuzk_supervisor_gpu_memory_used_bytes", gpu="0", name="NVIDIA H200") == 20 * GIB
    assert at("cuzk_supervisor_gpu_memory_capacity_bytes", gpu="0", name="NVIDIA H200") == 141 * GIB
    assert at("cuzk_supervisor_manager_outbox_depth") == 2
    assert not [name for name, _ in samples if name.endswith("_created")]


async def test_metrics_refresh_runs_per_scrape_and_a_failing_one_is_survived(source, metrics):
    depth = iter([3, 5])

    def refresh() -> None:
        metrics.outbox_depth(next(depth))  # StopIteration on the third scrape

    async with (
        HealthServer("127.0.0.1:0", source, metrics, refresh=refresh) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        for expected in (3, 5, 5):
            response = await http.get("/metrics?name[]=x")  # a query string is ignored
            assert response.status_code == 200
            assert f"cuzk_supervisor_manager_outbox_depth {expected}.0" in response.text


# --- everything else ------------------------------------------------------------------------------


async def test_unknown_paths_are_404_and_other_methods_405(client):
    for path in ("/", "/nope", "/healthz/extra"):
        assert (await client.get(path)).status_code == 404, path
    response = await client.post("/healthz", content=b"x" * 20000)
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert (await client.head("/metrics")).status_code == 405
    assert (await client.delete("/nope")).status_code == 405


async def test_huge_request_head_is_refused(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 431 ")
    writer.close()


async def test_garbage_request_line_is_400(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"hello\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 400 ")
    writer.close()


async def test_a_silent_or_slow_client_does_not_block_others(source, metrics):
    async with (
        HealthServer("127.0.0.1:0", source, metrics, request_timeout_s=0.5) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", server.port)
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", server.port)
        slow_writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        await slow_writer.drain()
        await wait_until(lambda: server.open_connections == 2)
        for _ in range(3):
            assert (await http.get("/healthz")).status_code == 200
        # Both are dropped by the request deadline: EOF, no answer.
        assert await asyncio.wait_for(silent_reader.read(), 5) == b""
        assert await asyncio.wait_for(slow_reader.read(), 5) == b""
        await wait_until(lambda: server.open_connections == 0)
        silent_writer.close()
        slow_writer.close()


async def test_at_the_cap_the_oldest_slow_client_makes_room(source, metrics):
    async with (
        HealthServer("127.0.0.1:0", source, metrics, max_connections=1) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
        await wait_until(lambda: server.open_connections == 1)
        # The probe that arrives now is answered; the idle one, still without a head, goes.
        assert (await http.get("/healthz")).status_code == 200
        try:
            gone = await asyncio.wait_for(idle_reader.read(), 5)
        except ConnectionResetError:
            gone = b""
        assert gone == b""
        assert server.dropped["evicted"] == 1
        idle_writer.close()
        await wait_until(lambda: server.open_connections == 0)


async def test_at_the_cap_with_every_slot_answering_a_newcomer_is_refused(source, metrics):
    async with HealthServer("127.0.0.1:0", source, metrics, max_connections=1) as server:
        server.linger_s = 60  # the first one stays in its lingering close until it closes
        first_reader, first_writer = await asyncio.open_connection("127.0.0.1", server.port)
        first_writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(first_reader.read(), 5)  # EOF: the answer is complete
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert server.open_connections == 1  # answered, not reading a head: not evictable
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        try:
            refused_answer = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            refused_answer = b""
        assert refused_answer == b""
        assert server.dropped["refused"] == 1
        writer.close()
        first_writer.close()
        await wait_until(lambda: server.open_connections == 0)
        async with httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http:
            assert (await http.get("/healthz")).status_code == 200


# --- hostile clients: slow ones, a flood over the cap, early disconnects -------------------------


class SlowClients:
    """``count`` connections that send a request head a byte at a time and never finish it
    (slowloris); each one dropped by the server is opened again at once, as an attacker would."""

    HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000

    def __init__(self, port: int, count: int, interval_s: float = 0.25) -> None:
        self.port = port
        self.count = count
        self.interval_s = interval_s
        self.reconnects = 0
        self.connected = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)

    def __enter__(self) -> SlowClients:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
        except OSError:
            return None  # the backlog is full for a moment: try again on the next round
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        socks: dict[socket.socket, int] = {}
        try:
            while not self._stop.is_set():
                while len(socks) < self.count and not self._stop.is_set():
                    sock = self._open()
                    if sock is None:
                        break
                    socks[sock] = 0
                self.connected = len(socks)
                readable, _, _ = select.select(list(socks), [], [], self.interval_s)
                for sock in readable:  # the server closed it (EOF or RST): reconnect
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data:
                        del socks[sock]
                        sock.close()
                        self.reconnects += 1
                for sock, sent in list(socks.items()):
                    if sent < len(self.HEAD):
                        with contextlib.suppress(OSError):  # dropped: select sees it next round
                            socks[sock] += sock.send(self.HEAD[sent : sent + 1])
        except BaseException as exc:  # surfaced by the test, not lost in a thread
            self.errors.append(exc)
        finally:
            for sock in socks:
                sock.close()


def kubelet_probe(
    port: int, path: str = "/healthz", timeout_s: float | None = None
) -> tuple[int, float]:
    """One probe as the kubelet makes it: a new connection, GET, read to EOF, within the timeout
    (the kubelet's default timeoutSeconds, 1 s, on the reference machine; longer on a slow one:
    the probes' tests are about the server not starving a probe, which then gets no answer at
    all, not about the machine's speed). (status, seconds); status 0 when it got no answer in
    time."""
    timeout_s = patient(1.0) if timeout_s is None else timeout_s
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.31\r\n\r\n"
            sock.sendall(head.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError
    except OSError:
        return 0, time.monotonic() - started
    answer = b"".join(chunks)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


async def probes(port: int, count: int = 20) -> list[tuple[int, float]]:
    results = []
    for _ in range(count):
        results.append(await asyncio.to_thread(kubelet_probe, port))
    return results


async def test_probes_are_answered_with_200_slow_clients_connected(source, metrics):
    # A long head deadline, so all 200 stay connected at once for the whole test.
    async with HealthServer("127.0.0.1:0", source, metrics, head_timeout_s=60) as server:
        with SlowClients(server.port, 200) as attackers:
            await wait_until(lambda: server.open_connections >= 200, within_s=30)
            results = await probes(server.port)
            assert server.open_connections >= 200  # still all there: nobody was let go
            assert attackers.errors == []
        assert [status for status, _ in results] == [200] * 20, results  # each in its timeout


async def test_the_kernel_queues_connections_beyond_the_connection_cap(source, metrics):
    """The listen backlog is not max_connections: while the server has not accepted them yet,
    100 connections (the flood's reconnects, a probe among them) all complete their handshake."""
    async with HealthServer("127.0.0.1:0", source, metrics, max_connections=16) as server:
        # Blocking the loop on purpose: nothing is accepted while these connect.
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=0.5)
                 for _ in range(100)]  # fmt: skip
        for sock in socks:
            sock.close()


async def test_probes_get_through_a_flood_over_the_connection_cap(source, metrics):
    # 200 slow clients against 16 slots, each dropped one reconnecting at once, and the head
    # deadline cutting the slow ones off: a probe evicts the oldest slow client and is answered.
    async with HealthServer(
        "127.0.0.1:0", source, metrics, max_connections=16, head_timeout_s=0.5
    ) as server:
        with SlowClients(server.port, 200) as attackers:
            await wait_until(lambda: server.open_connections == 16, within_s=30)
            await wait_until(lambda: attackers.reconnects > 0, within_s=30)
            results = await probes(server.port)
            assert attackers.errors == []
        assert [status for status, _ in results] == [200] * 20, results  # each in its timeout
        assert server.dropped["evicted"] > 0
        assert server.open_connections <= 16


def early_disconnects(port: int, count: int) -> None:
    """``count`` clients that leave early, in every way a client can: closing before a request,
    resetting before or inside one, resetting right after sending it, leaving before the answer
    is read."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    reset = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        kind = i % 5
        if kind == 1:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        elif kind == 2:
            sock.sendall(request[:10])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        elif kind == 3:
            sock.sendall(request)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        elif kind == 4:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


async def test_early_disconnects_are_counted_not_logged(source, metrics, caplog):
    loop_errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    caplog.set_level(logging.DEBUG)
    try:
        with structlog.testing.capture_logs() as events:
            # The head deadline only a hang reaches: on a slow machine a client thread starved
            # between its connect and its request is not one of the early disconnects.
            async with HealthServer(
                "127.0.0.1:0", source, metrics, head_timeout_s=patient(60)
            ) as server:
                await asyncio.to_thread(early_disconnects, server.port, 1000)
                await wait_until(lambda: server.open_connections == 0, within_s=30)
                status, _ = await asyncio.to_thread(kubelet_probe, server.port)
                assert status == 200
                # One in five closes before sending anything: at least those are counted as
                # gone. Clients faster than the loop fill the cap, and then the oldest ones
                # still unread are evicted (counted too).
                assert server.dropped["disconnect"] >= 200, server.dropped
                assert set(server.dropped) <= {"disconnect", "evicted"}, server.dropped
                scrape = (await asyncio.to_thread(_get, server.port, "/metrics")).decode()
    finally:
        loop.set_exception_handler(None)
    assert [e for e in events if e["event"] != "health.listening"] == []
    assert loop_errors == []
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []
    assert "Traceback" not in caplog.text
    name = 'cuzk_supervisor_health_connections_dropped_total{reason="disconnect"}'
    assert f"{name} {float(server.dropped['disconnect'])}" in scrape


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# --- addresses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:9822", "10.1.2.3:9822", "[::]:9822"])
def test_a_public_address_is_refused_unless_allowed(source, metrics, listen):
    with pytest.raises(HealthServerError, match="not a loopback address"):
        HealthServer(listen, source, metrics)
    HealthServer(listen, source, metrics, allow_public=True)  # construction only: no bind


async def test_allow_public_really_listens(source, metrics):
    async with (
        HealthServer("0.0.0.0:0", source, metrics, allow_public=True) as server,
        httpx.AsyncClient(timeout=5, trust_env=False) as http,
    ):
        response = await http.get(f"http://127.0.0.1:{server.port}/healthz")
        assert response.status_code == 200


@pytest.mark.parametrize(
    "listen",
    ["localhost:9822", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:http", "unix:///tmp/h.sock", ""],
)
def test_a_bad_address_is_a_usage_error(source, metrics, listen):
    with pytest.raises(HealthServerError, match="bad health_listen") as caught:
        HealthServer(listen, source, metrics)
    assert isinstance(caught.value, UsageError)


def test_parse_and_check_listen_bind_nothing():
    assert parse_listen("127.0.0.1:9822") == ("127.0.0.1", 9822)
    assert parse_listen(" [::1]:0 ") == ("::1", 0)
    assert parse_listen("0.0.0.0:9822") == ("0.0.0.0", 9822)
    assert check_listen("[::1]:9822") == ("::1", 9822)
    with pytest.raises(HealthServerError, match="not a loopback address"):
        check_listen("0.0.0.0:9822")
    assert check_listen("0.0.0.0:9822", allow_public=True) == ("0.0.0.0", 9822)


async def test_a_busy_port_is_a_clear_error(source, metrics):
    async with HealthServer("127.0.0.1:0", source, metrics) as first:
        second = HealthServer(f"127.0.0.1:{first.port}", source, metrics)
        with pytest.raises(HealthServerError) as caught:
            await second.start()
        assert str(caught.value) == (
            f"health server cannot listen on 127.0.0.1:{first.port}: address already in use "
            "(setting health_listen; health_enabled=false turns the server off)"
        )
        # The first one is unharmed.
        async with httpx.AsyncClient(base_url=first.url, timeout=5, trust_env=False) as http:
            assert (await http.get("/healthz")).status_code == 200


# --- shutting down ------------------------------------------------------------------------------


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


async def test_leaving_the_block_closes_open_connections(source, metrics):
    server = HealthServer("127.0.0.1:0", source, metrics, request_timeout_s=60)
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await wait_until(lambda: server.open_connections == 1)
    assert server.open_connections == 0
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert refused(server.port)
    await server.close()  # twice is fine


async def test_serve_closes_cleanly_when_cancelled(source, metrics):
    server = HealthServer("127.0.0.1:0", source, metrics, request_timeout_s=60)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.port != 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await wait_until(lambda: server.open_connections == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert refused(server.port)
