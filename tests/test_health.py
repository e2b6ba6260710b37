"""The health server over real loopback sockets, with a fake source and an injectable clock.

No fixed sleeps synchronise anything: a stale heartbeat comes from the fake clock (or from
blocking the loop on purpose), and waits are for events (EOF on a socket, a condition polled
with a deadline).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.errors import UsageError
from supervisor.exits import ExitKind
from supervisor.gpu import GpuDevice
from supervisor.health import (
    HealthServer,
    HealthServerError,
    Heartbeat,
    LifecycleSource,
    check_listen,
    parse_listen,
)
from supervisor.metrics import CONTENT_TYPE, SupervisorMetrics
from supervisor.policy import RiskLevel

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
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


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
    assert body["loop_lag_s"] == pytest.approx(9.5)
    assert "late" in body["reason"]
    # The next beat is itself 9.5 s late (see the Heartbeat test); the one after is on time.
    # The real heartbeat task may beat in between too, which changes nothing here.
    server.heartbeat.beat()
    server.heartbeat.beat()
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["loop_lag_s"] == 0


async def test_healthz_sees_a_loop_that_was_blocked(source, metrics):
    async with (
        HealthServer(
            "127.0.0.1:0", source, metrics, heartbeat_interval_s=0.05, stale_after_s=0.2
        ) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http,
    ):
        assert (await http.get("/healthz")).status_code == 200
        # The thing under test: a blocking call in the event loop.
        time.sleep(0.5)  # noqa: ASYNC251
        response = await http.get("/healthz")
        assert response.status_code == 503
        assert response.json()["loop_lag_s"] >= 0.4
        # Once the loop turns freely again the heartbeat catches up.
        deadline = time.monotonic() + 5
        while (await http.get("/healthz")).status_code != 200:
            assert time.monotonic() < deadline, "the heartbeat never caught up"
            await asyncio.sleep(0.02)


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
    assert at("cuzk_supervisor_daemon_restarts_total", kind="oom_killed") == 1
    assert at("cuzk_supervisor_daemon_restarts_total", kind="crashed") == 0
    assert at("cuzk_supervisor_proofs_completed_total") == 1
    assert at("cuzk_supervisor_proofs_failed_total") == 1
    assert at("cuzk_supervisor_proof_duration_seconds_count") == 1
    assert at("cuzk_supervisor_proof_duration_seconds_sum") == 42.0
    assert at("cuzk_supervisor_bench_rate_proofs_per_hour") == 55.5
    assert at("cuzk_supervisor_memory_headroom_bytes") == 7 * GIB
    assert at("cuzk_supervisor_oom_risk_level") == 2
    assert at("cuzk_supervisor_gpu_memory_used_bytes", gpu="0", name="NVIDIA H200") == 20 * GIB
    assert at("cuzk_supervisor_gpu_memory_total_bytes", gpu="0", name="NVIDIA H200") == 141 * GIB
    assert at("cuzk_supervisor_manager_outbox_depth") == 2


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


async def test_connections_over_the_cap_are_dropped_at_once(source, metrics):
    async with HealthServer("127.0.0.1:0", source, metrics, max_connections=1) as server:
        _idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
        await wait_until(lambda: server.open_connections == 1)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        try:
            answer = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
        writer.close()
        idle_writer.close()
        await wait_until(lambda: server.open_connections == 0)
        async with httpx.AsyncClient(base_url=server.url, timeout=5, trust_env=False) as http:
            assert (await http.get("/healthz")).status_code == 200


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
