"""The manager client and the durable outbox, against a scripted manager (``scripted``: a
FunctionTransport answering like the real manager, docs/manager-api.md, with failures a test
queues first). Backoff is shrunk to milliseconds; the retry stops are read on an injected clock
where a test is about them, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from scripted import (
    FAST,
    GONE,
    URL,
    FakeClock,
    ScriptedManager,
    TickingClock,
)
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.logship.push import MAX_BODY_BYTES
from cuzk_supervisor.adapters.manager.away import AwayWarnings
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import (
    HttpRetryPolicy,
    InstanceGone,
    ManagerRejected,
    ManagerRetry,
    ManagerTimeouts,
    ManagerUnavailable,
    Weather,
    is_transient,
)
from cuzk_supervisor.adapters.manager.wire import ConnectFailed, Dropped, TimedOut
from cuzk_supervisor.core.reports import (
    PARAM_DONE,
    RUNNING,
)


@pytest.fixture
def manager() -> ScriptedManager:
    return ScriptedManager()


# --- retry rules --------------------------------------------------------------------------------


async def test_503s_then_success_is_retried_and_acknowledged_once(manager):
    manager.fail("/param-done", 503, (503, {"error": "database is locked"}))
    async with manager.client() as client:
        with capture_logs() as logs:
            await client.param_done("u-1")
        counts = client.failures
    assert manager.paths() == ["/param-done"] * 3
    # Counted, not logged one by one: one warning for the outage, one line when it is back.
    assert (counts.failed, dict(counts.by_call), dict(counts.by_reason)) == (
        2, {PARAM_DONE: 2}, {"HTTP 503": 2},
    )  # fmt: skip
    loud = [e for e in logs if e["log_level"] in ("warning", "info")]
    assert [e["event"] for e in loud] == ["manager.away", "manager.back"]
    # The warning names what answered: status, Server header, the body's first line.
    assert loud[0]["reason"] == 'HTTP 503 (no Server header): "{"error":"scripted"}"'
    assert loud[1]["failed"] == 2


async def test_the_managers_json_400_is_final_with_its_reason(manager):
    manager.fail("/register", (400, {"error": "label is required"}))
    async with manager.client() as client:
        with pytest.raises(ManagerRejected) as caught:
            await client.register("C.1", 30)
    assert caught.value.status == 400
    assert caught.value.message == "label is required"
    assert len(manager.requests) == 1


@pytest.mark.parametrize(
    ("path", "call"),
    [
        ("/running", lambda c: c.running("u-1")),
        ("/bench-done", lambda c: c.bench_done("u-1", 60.0)),
        ("/param-done", lambda c: c.param_done("u-1")),
    ],
)
async def test_the_managers_json_404_on_a_report_means_the_instance_is_gone(manager, path, call):
    manager.fail(path, (404, GONE[path]))
    async with manager.client() as client:
        with pytest.raises(InstanceGone, match=GONE[path]["error"]):
            await call(client)
    assert len(manager.requests) == 1


@pytest.mark.parametrize("failure", [TimedOut, TimedOut("connect", 3.0), TimedOut("write", 1.0)])
async def test_timeouts_are_retried(manager, failure):
    manager.fail("/bench-done", failure, failure)
    async with manager.client() as client:
        verdict = await client.bench_done("u-1", 60.0)
    assert verdict.passed
    assert len(manager.requests) == 3


@pytest.mark.parametrize("failure", [ConnectFailed, Dropped])
async def test_connection_errors_are_retried(manager, failure):
    manager.fail("/register", failure)
    async with manager.client() as client:
        registration = await client.register("C.1", 30)
    assert registration.uuid == "u-1"
    assert registration.runner_id == 7
    assert len(manager.requests) == 2


async def test_retrying_stops_at_the_calls_stop_and_says_why(manager):
    manager.fail("/running", *([503] * 1000))
    retry = dataclasses.replace(FAST, report_stop_s=25.0)
    async with manager.client(retry=retry, clock=TickingClock(manager, 10.0)) as client:
        with capture_logs() as logs, pytest.raises(ManagerUnavailable) as caught:
            await client.running("u-1")
    assert caught.value.attempts == len(manager.requests) == 3  # at +10, +20, +30 s
    assert caught.value.weather
    assert "HTTP 503" in caught.value.reason
    assert any(e["event"] == "manager.unavailable" for e in logs)


async def test_a_callers_stop_s_cuts_the_retrying(manager):
    manager.fail("/register", *([ConnectFailed] * 1000))
    retry = dataclasses.replace(FAST, register_stop_s=1000.0)
    async with manager.client(retry=retry, clock=TickingClock(manager, 10.0)) as client:
        with pytest.raises(ManagerUnavailable) as caught:
            await client.register("C.1", 30, stop_s=25.0)
    assert len(manager.requests) == 3
    assert not caught.value.weather  # no answer at all: the manager is away


async def test_a_real_refused_connection_is_retried_until_the_stop():
    # No transport injected: real sockets, so the real exception classes are checked.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    retry = dataclasses.replace(FAST, report_stop_s=1.0)
    async with ManagerClient(f"http://127.0.0.1:{port}", retry=retry) as client:
        with pytest.raises(ManagerUnavailable, match="ConnectFailed") as caught:
            await client.param_done("u-1")
    assert caught.value.attempts >= 2


async def test_a_real_server_that_never_answers_times_out_and_is_retried():
    accepted = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read()  # hold the connection; never answer

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    retry = dataclasses.replace(FAST, report_stop_s=2.0)
    timeouts = ManagerTimeouts(read_s=0.05)
    try:
        async with ManagerClient(
            f"http://127.0.0.1:{port}", retry=retry, timeouts=timeouts
        ) as client:
            # The last attempt gets what is left of the stop: on a loaded machine that can be
            # too little to connect (CI: "connect timed out after 0.001s").
            with pytest.raises(ManagerUnavailable, match=r"(read|connect) timed out") as caught:
                await client.running("u-1")
    finally:
        server.close()
    # A timed-out exchange leaves the connection in an unknown state: a new one each attempt
    # (the last one's perhaps not accepted before it gave up).
    assert caught.value.attempts >= 2
    assert caught.value.attempts - 1 <= accepted <= caught.value.attempts


def _told(logs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(event, level) of each line about the manager being away, above debug."""
    events = ("manager.away", "manager.still_away", "manager.back", "manager.unavailable",
              "manager.retry")  # fmt: skip
    return [(e["event"], e["log_level"]) for e in logs
            if e["event"] in events and e["log_level"] != "debug"]  # fmt: skip


async def test_an_outage_is_one_warning_naming_the_url_then_a_summary_a_minute(manager):
    """Issue 14.3 and 22: a person sees at once where the supervisor tries to go, then a steady
    summary whichever calls fail meanwhile; the failures themselves are counted, not logged
    (every line is shipped to the manager: retry lines were a backlog of their own)."""
    manager.fail("/register", *([ConnectFailed] * 3))
    retry = dataclasses.replace(FAST, register_stop_s=1000.0)
    clock = TickingClock(manager, 40.0)  # 40 s per attempt
    async with manager.client(retry=retry, clock=clock) as client:
        with capture_logs() as logs:
            await client.register("C.1", 30)  # +40 warns, +80 counted, +120 sums up, +160 back
            manager.fail("/register", *([ConnectFailed] * 1000))
            with pytest.raises(ManagerUnavailable):
                await client.register("C.1", 30, stop_s=30.0)
        counts = client.failures
    told = _told(logs)
    assert told[:3] == [("manager.away", "warning"), ("manager.still_away", "warning"),
                        ("manager.back", "info")]  # fmt: skip
    away = next(e for e in logs if e["event"] == "manager.away")
    assert (away["url"], away["call"]) == (URL, "register")
    summary = next(e for e in logs if e["event"] == "manager.still_away")
    assert (summary["failed"], summary["by_call"]) == (2, {"register": 2})
    back = next(e for e in logs if e["event"] == "manager.back")
    assert back["failed"] == 3
    assert back["away_s"] == pytest.approx(120.0, abs=1.0)
    # A new outage after the answer is told at once again.
    assert told[3] == ("manager.away", "warning")
    assert counts.outages == 2
    assert counts.gave_up == 1
    assert counts.failed == counts.by_call["register"] >= 4


async def test_one_outage_is_one_warning_across_calls(manager):
    """A second call that fails in the same outage is not a second warning (before issue 14.3
    each call's first failure was one: a warning every status interval)."""
    for path in ("/param-done", "/running"):
        manager.fail(path, *([ConnectFailed] * 1000))
    clock = TickingClock(manager, 1.0)
    retry = dataclasses.replace(FAST, report_stop_s=10.0)
    async with manager.client(retry=retry, clock=clock) as client:
        with capture_logs() as logs:
            for call in (lambda: client.param_done("u-1"), lambda: client.running("u-1")):
                with pytest.raises(ManagerUnavailable):
                    await call()
        counts = client.failures
    assert len(manager.requests) < 30  # all within the first minute of the outage
    assert _told(logs) == [("manager.away", "warning")]
    assert set(counts.by_call) == {PARAM_DONE, RUNNING}
    assert counts.gave_up == 2


def test_away_warnings_keep_a_steady_cadence_and_say_when_it_is_back():
    clock = FakeClock()
    away = AwayWarnings(URL, every_s=60, clock=clock)
    heard: list[tuple[str, int, float]] = []
    away.listeners.append(lambda *args: heard.append(args))
    with capture_logs() as logs:
        for at, step in (
            (0, lambda: away.failed("register", 1, "ConnectError", 1.0)),
            (10, lambda: away.failed(PARAM_DONE, 1, "HTTP 503: x", 2.0, retry_after=True)),
            (59, lambda: away.failed("status", 1, "ConnectError", 3.0)),
            (61, lambda: away.failed(RUNNING, 1, "ConnectError", 4.0)),
            (70, lambda: away.gave_up(RUNNING, 2, 9.0, "ConnectError")),
            (125, lambda: away.failed(RUNNING, 2, "HTTP 429: slow down", 5.0)),
            (126, lambda: away.answered(RUNNING)),
            (127, lambda: away.answered(RUNNING)),  # not away: nothing to say
            (128, lambda: away.failed("register", 1, "ConnectError", 1.0)),  # 3 s after a line
            (190, lambda: away.failed("register", 2, "ConnectError", 1.0)),
        ):
            clock.now = 1000.0 + at
            step()
    told = [(e["event"], e.get("away_s"), e.get("failed")) for e in logs
            if e["log_level"] != "debug"]  # fmt: skip
    assert told == [
        ("manager.away", None, 1),
        ("manager.still_away", 61.0, 3),  # the failures at +10, +59 and +61
        ("manager.still_away", 125.0, 1),
        ("manager.back", 126.0, 5),
        # A new outage 3 s after a line (a flapping proxy): counted, told at the cadence.
        ("manager.away", None, 2),
    ]
    assert all(e["url"] == URL for e in logs if e["log_level"] != "debug")
    counts = away.counts
    assert (counts.failed, counts.gave_up, counts.retry_after, counts.outages) == (7, 1, 1, 2)
    assert dict(counts.by_reason) == {"ConnectError": 5, "HTTP 503": 1, "HTTP 429": 1}
    assert [call for call, _, _ in heard] == ["register", PARAM_DONE, "status", RUNNING,
                                               RUNNING, "register", "register"]  # fmt: skip
    assert away.away


def test_the_warning_cadence_is_a_setting_of_the_retry_values():
    assert ManagerRetry().warn_every_s == 60.0
    with pytest.raises(ValueError, match="warn_every_s"):
        ManagerRetry(warn_every_s=0)


def test_only_transient_errors_are_retried():
    assert is_transient(ConnectFailed("x"))
    assert is_transient(TimedOut("read", 1.0))
    assert is_transient(Dropped("x"))
    assert is_transient(Weather(404, "HTTP 404 from nginx"))
    assert not is_transient(ManagerRejected("x", 400, "bad"))
    assert not is_transient(InstanceGone("running", "u-1", "instance not found"))
    assert not is_transient(ValueError("x"))


def test_retry_policy_is_a_value():
    assert FAST.policy("register") == HttpRetryPolicy("register", 0.001, 0.005, 2.0)
    assert FAST.policy("log_push").stop_s == 0.5
    assert FAST.policy("running").stop_s == 2.0
    with pytest.raises(ValueError, match="backoff_max_s"):
        ManagerRetry(backoff_base_s=2.0, backoff_max_s=1.0)


# --- answers ------------------------------------------------------------------------------------


async def test_register_sends_label_and_min_rate(manager):
    async with manager.client() as client:
        await client.register("C.42", 30.0)
    assert json.loads(manager.requests[0].content) == {"label": "C.42", "min_rate": 30.0}
    assert manager.requests[0].method == "POST"


async def test_register_answer_without_uuid_is_retried_like_an_outage(manager):
    manager.fail("/register", (200, {"runner_id": 1}), (200, "<html>Down for maintenance</html>"))
    async with manager.client() as client:
        registration = await client.register("C.1", 30)
    assert (registration.uuid, registration.runner_id) == ("u-1", 7)
    assert manager.paths() == ["/register"] * 3


async def test_non_json_success_is_retried_not_taken_as_an_answer(manager):
    manager.fail("/bench-done", (200, "<html>proxy</html>"), (200, {"ok": True}))
    async with manager.client() as client:
        verdict = await client.bench_done("u-1", 60.0)
    assert verdict.passed is True
    assert len(manager.requests) == 3


async def test_a_manager_that_only_answers_html_is_unavailable(manager):
    manager.fail("/running", *[(200, "<html>maintenance</html>")] * 100_000)
    async with manager.client(retry=FAST) as client:
        with pytest.raises(ManagerUnavailable, match="not JSON"):
            await client.running("u-1")
    assert len(manager.requests) > 1


async def test_status_that_is_not_a_list_is_retried(manager):
    manager.record = {"uuid": "u-1", "state": "running"}
    manager.fail("/status", (200, "<html>502</html>"), (200, {"error": "x"}))
    async with manager.client() as client:
        record = await client.instance_record("u-1")
    assert record == {"uuid": "u-1", "state": "running"}


@pytest.mark.parametrize(("rate", "passed"), [(60.0, True), (50.0, True), (35.9, False)])
async def test_bench_verdict_is_a_value(manager, rate, passed):
    async with manager.client() as client:
        verdict = await client.bench_done("u-1", rate)
    assert verdict.passed is passed
    assert verdict.checked
    assert json.loads(manager.requests[0].content) == {"uuid": "u-1", "rate": rate}


async def test_push_logs_sends_headers_and_lines(manager):
    async with manager.client() as client:
        await client.push_logs("u-1", "cuzk", ["a", "b\n", ""])
    request = manager.requests[0]
    assert request.headers["X-Instance-UUID"] == "u-1"
    assert request.headers["X-Log-Source"] == "cuzk"
    assert request.content == b"a\nb\n"


async def test_push_logs_never_sends_a_body_over_256_kib(manager):
    lines = ["x" * 100_000] * 7 + ["é" * 200_000]  # the last line is 400 KB of UTF-8
    async with manager.client() as client:
        bodies = await client.push_logs("u-1", "benchout", lines)
    assert bodies == len(manager.requests) >= 4
    assert all(len(r.content) <= MAX_BODY_BYTES for r in manager.requests)
    received = b"".join(r.content for r in manager.requests).decode().splitlines()
    assert received[:7] == lines[:7]
    assert received[7].startswith("é" * 1000)
    assert received[7].endswith("bytes]")
    assert "truncated" in received[7]
