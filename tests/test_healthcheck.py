"""``cuzk-supervisor healthcheck`` (the image's HEALTHCHECK) against a real health server.

Each case runs the command as a process, as Docker does, and checks its exit code and that it
says why in exactly one line, never a traceback. The last one runs ``sim`` with an explicit
``--health-listen`` and follows ``/startupz`` from 503 to 200 through the lifecycle's phases.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from simhelpers import demo_sim, free_tcp_port, poll_until

from cuzk_supervisor.cli.commands.healthcheck import probe_url
from cuzk_supervisor.serve.health import HealthServer
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.serve.probes import StartupLatch


@dataclass
class FakeSource:
    phase: str = "warmup"
    daemon_ready: bool = False
    last_failure: str = ""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_SUPERVISOR_")}
    return {**env, **extra}


async def healthcheck(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, everything it printed) of the command as its own process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cuzk_supervisor", "healthcheck", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=env if env is not None else clean_env(),
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


def one_line(text: str) -> str:
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


class MinuteLateClock:
    """Each reading a minute after the one before: the heartbeat looks a minute late at every
    beat and every probe, however soon the real loop runs it (a clock moved forward once could
    be caught up by a beat on a slow machine before the probe's process came up)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 60
        return self.now


async def test_healthy_from_the_flag_and_from_the_environment():
    async with HealthServer("127.0.0.1:0", FakeSource(), SupervisorMetrics()) as server:
        code, out = await healthcheck("--health-listen", f"127.0.0.1:{server.port}")
        assert code == 0
        assert one_line(out).startswith(f"healthy: GET http://127.0.0.1:{server.port}/healthz: 200")
        # The same setting, from where the image sets it.
        env = clean_env(CUZK_SUPERVISOR_HEALTH_LISTEN=f"127.0.0.1:{server.port}")
        code, out = await healthcheck(env=env)
        assert code == 0, out


async def test_the_servers_reason_in_one_line_when_unhealthy():
    async with HealthServer(
        "127.0.0.1:0", FakeSource(), SupervisorMetrics(), clock=MinuteLateClock()
    ) as server:
        code, out = await healthcheck("--health-listen", f"127.0.0.1:{server.port}")
    assert code == 1
    line = one_line(out)
    assert line.startswith(f"unhealthy: GET http://127.0.0.1:{server.port}/healthz: 503 ")
    assert "heartbeat late" in line


async def test_no_server_is_one_line_not_a_traceback():
    port = free_tcp_port()  # nothing listens there
    code, out = await healthcheck("--health-listen", f"127.0.0.1:{port}")
    assert code == 1
    assert one_line(out) == f"unhealthy: GET http://127.0.0.1:{port}/healthz: Connection refused"


async def test_server_turned_off_or_a_bad_setting_is_one_line():
    code, out = await healthcheck(env=clean_env(CUZK_SUPERVISOR_HEALTH_ENABLED="false"))
    assert (code, one_line(out)) == (
        1,
        "unhealthy: the health server is off (health_enabled=false)",
    )
    code, out = await healthcheck("--health-listen", "localhost:9822")
    assert code == 1  # 1, not 2: Docker reserves 2
    assert one_line(out).startswith("unhealthy: bad health_listen 'localhost:9822'")


async def test_a_wildcard_listen_is_probed_on_loopback():
    assert probe_url("0.0.0.0:9822") == "http://127.0.0.1:9822/healthz"
    assert probe_url("[::]:9822", "/startupz") == "http://[::1]:9822/startupz"
    assert probe_url("127.0.0.2:1") == "http://127.0.0.2:1/healthz"
    async with HealthServer(
        "0.0.0.0:0", FakeSource(), SupervisorMetrics(), allow_public=True
    ) as server:
        code, out = await healthcheck("--health-listen", f"0.0.0.0:{server.port}")
    assert code == 0, out


async def test_path_startupz_follows_the_latch():
    latch = StartupLatch()
    async with HealthServer(
        "127.0.0.1:0", FakeSource(), SupervisorMetrics(), startup=latch
    ) as server:
        listen = f"127.0.0.1:{server.port}"
        code, out = await healthcheck("--health-listen", listen, "--path", "/startupz")
        assert code == 1
        assert "slow start not over: in phase warmup" in one_line(out)
        latch.on_phase("settle")
        code, out = await healthcheck("--health-listen", listen, "--path", "/startupz")
        assert code == 0, out


def _get(url: str) -> tuple[int, dict[str, object]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_sim_listens_where_the_setting_says_and_startupz_follows_the_phases(tmp_path):
    port = free_tcp_port()
    output = tmp_path / "sim.out"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cuzk_supervisor", "sim", "--sim-dir", str(tmp_path / "sim"),
             "--health-listen", f"127.0.0.1:{port}", "--log-format", "json", *demo_sim()],
            stdout=sink, stderr=subprocess.STDOUT, env=clean_env(),
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        # Up before the slow start is over: alive, not started.
        status, body = poll_until(lambda: _get(f"{base}/startupz"), 60, what="/startupz answers")
        assert status == 503, body
        assert body["started"] is False
        assert body["phase"] in {"start", "register", "params", "plan", "warmup"}
        assert _get(f"{base}/healthz")[0] == 200
        status, body = poll_until(
            lambda: (answer := _get(f"{base}/startupz"))[0] == 200 and answer,
            90,
            what="/startupz turns 200",
        )
        assert body["started"] is True
        code = subprocess.run(
            [sys.executable, "-m", "cuzk_supervisor", "healthcheck", "--health-listen",
             f"127.0.0.1:{port}", "--path", "/startupz"],
            capture_output=True, text=True, env=clean_env(), timeout=60, check=False,
        )  # fmt: skip
        assert code.returncode == 0, code.stdout + code.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    except BaseException:
        print(output.read_text(errors="replace")[-3000:])
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
