"""The manager client and the durable outbox, against a scripted manager (httpx.MockTransport).

The script answers like the real manager (reference/manager-api.md) unless a test queues
failures for a path: a status code, a (status, body) pair, or an exception to raise (how
httpx reports timeouts and refused connections). Backoff is shrunk to milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.logship.push import MAX_BODY_BYTES
from cuzk_supervisor.adapters.manager.away import AwayWarnings
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import (
    HttpRetryPolicy,
    InstanceGone,
    ManagerRejected,
    ManagerRetry,
    ManagerTimeouts,
    ManagerUnavailable,
    is_transient,
)
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore, StateWriteError
from cuzk_supervisor.core.reports import (
    BENCH_DONE,
    OUTCOME_GONE,
    OUTCOME_OK,
    OUTCOME_REJECTED,
    PARAM_DONE,
    RUNNING,
)

URL = "http://manager.test:8080"
OTHER = {"uuid": "u-other", "label": "C.2", "runner_id": 3, "state": "running", "min_rate": 30}
"""Another instance of the fleet, in every ``GET /status`` answer."""
FAST = ManagerRetry(
    backoff_base_s=0.001,
    backoff_max_s=0.005,
    register_stop_s=2.0,
    report_stop_s=2.0,
    log_stop_s=0.5,
)


class SimulatedCrash(BaseException):
    """The supervisor process dies here."""


class ScriptedManager:
    """A MockTransport handler: real-manager answers, with scripted failures first."""

    def __init__(self, min_rate: float = 50.0) -> None:
        self.min_rate = min_rate
        self.requests: list[httpx.Request] = []
        self.steps: dict[str, list[Any]] = defaultdict(list)
        self.on_request: Any = None
        # The instance's record as GET /status lists it, kept as the real manager keeps it.
        self.record: dict[str, Any] | None = None

    def fail(self, path: str, *steps: Any) -> None:
        self.steps[path].extend(steps)

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.on_request is not None:
            self.on_request(request)
        path = request.url.path
        if self.steps[path]:
            step = self.steps[path].pop(0)
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, type) and issubclass(step, httpx.TransportError):
                raise step("scripted", request=request)
            status, body = step if isinstance(step, tuple) else (step, {"error": "scripted"})
            if isinstance(body, str):
                return httpx.Response(status, text=body)
            return httpx.Response(status, json=body)
        return self.answer(path, request)

    def answer(self, path: str, request: httpx.Request) -> httpx.Response:
        if path == "/api/log-push":
            return httpx.Response(204)
        if path == "/status":
            # The manager lists every instance it knows: another one of the fleet, and ours.
            return httpx.Response(200, json=[OTHER, *([self.record] if self.record else [])])
        body = json.loads(request.content)
        if path == "/register":
            self.record = self.record or {
                "uuid": "u-1", "state": "registered", "min_rate": self.min_rate,
            }  # fmt: skip
            return httpx.Response(200, json={"uuid": "u-1", "runner_id": 7})
        record = self.record or {"uuid": body["uuid"], "state": "registered"}
        record["min_rate"] = self.min_rate
        self.record = record
        if path == "/param-done":
            if record["state"] == "registered":
                record.update(state="params_done", param_done_at=time.time())
            return httpx.Response(200, json={"ok": True})
        if path == "/running":
            record["state"] = "running"
            return httpx.Response(200, json={"ok": True})
        if path == "/bench-done":
            passed = body["rate"] >= self.min_rate
            if passed:
                record.update(state="bench_done", bench_rate=body["rate"], bench_done_at=1.0)
            else:
                record.update(state="killed", kill_reason="bench failed", killed_at=1.0)
            return httpx.Response(200, json={"ok": True, "passed": passed})
        return httpx.Response(404, json={"error": "not found"})

    def client(self, **kwargs: Any) -> ManagerClient:
        kwargs.setdefault("retry", FAST)
        return ManagerClient(URL, transport=httpx.MockTransport(self.handler), **kwargs)


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
    assert [e["event"] for e in loud] == ["manager.away", "manager.back", "manager.call_ok"]
    assert loud[0]["reason"] == "HTTP 503: scripted"
    assert loud[1]["failed"] == 2


async def test_400_is_not_retried(manager):
    manager.fail("/register", (400, {"error": "label is required"}))
    async with manager.client() as client:
        with pytest.raises(ManagerRejected) as caught:
            await client.register("C.1", 30)
    assert caught.value.status == 400
    assert caught.value.message == "label is required"
    assert len(manager.requests) == 1


async def test_plain_text_405_is_rejected_with_its_text(manager):
    manager.fail("/running", (405, "Method Not Allowed"))
    async with manager.client() as client:
        with pytest.raises(ManagerRejected, match="405: Method Not Allowed"):
            await client.running("u-1")
    assert len(manager.requests) == 1


@pytest.mark.parametrize(
    ("path", "call"),
    [
        ("/running", lambda c: c.running("u-1")),
        ("/bench-done", lambda c: c.bench_done("u-1", 60.0)),
        ("/param-done", lambda c: c.param_done("u-1")),
    ],
)
async def test_404_on_a_report_means_the_instance_is_gone(manager, path, call):
    manager.fail(path, (404, {"error": "instance not found or already killed"}))
    async with manager.client() as client:
        with pytest.raises(InstanceGone, match="instance not found or already killed"):
            await call(client)
    assert len(manager.requests) == 1


@pytest.mark.parametrize(
    "failure",
    [httpx.ReadTimeout, httpx.ConnectTimeout, httpx.WriteTimeout, httpx.PoolTimeout],
)
async def test_timeouts_are_retried(manager, failure):
    manager.fail("/bench-done", failure, failure)
    async with manager.client() as client:
        verdict = await client.bench_done("u-1", 60.0)
    assert verdict.passed
    assert len(manager.requests) == 3


@pytest.mark.parametrize(
    "failure", [httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError]
)
async def test_connection_errors_are_retried(manager, failure):
    manager.fail("/register", failure)
    async with manager.client() as client:
        registration = await client.register("C.1", 30)
    assert registration.uuid == "u-1"
    assert registration.runner_id == 7
    assert len(manager.requests) == 2


async def test_retrying_stops_at_the_calls_stop_and_says_why(manager):
    # 1000 failures, then an answer: a call that did not stop would end in the answer.
    manager.fail("/running", *([503] * 1000))
    retry = dataclasses.replace(FAST, report_stop_s=0.1)
    async with manager.client(retry=retry) as client:
        with capture_logs() as logs, pytest.raises(ManagerUnavailable) as caught:
            await client.running("u-1")
    assert caught.value.attempts < 1000  # the stop ended it, not the script
    assert caught.value.attempts >= 2
    assert caught.value.attempts == len(manager.requests)
    assert "HTTP 503" in caught.value.reason
    assert any(e["event"] == "manager.unavailable" for e in logs)


async def test_a_callers_stop_s_cuts_the_retrying(manager):
    # 1000 failures, then an answer; the call's own stop an hour: only the caller's stop_s can
    # end it before the answer.
    manager.fail("/register", *([httpx.ConnectError] * 1000))
    retry = dataclasses.replace(FAST, register_stop_s=3600.0)
    async with manager.client(retry=retry) as client:
        with pytest.raises(ManagerUnavailable) as caught:
            await client.register("C.1", 30, stop_s=0.05)
    assert caught.value.attempts == len(manager.requests) < 1000


async def test_a_real_refused_connection_is_retried_until_the_stop():
    # No transport injected: real sockets, so the real exception classes are checked.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Long enough for a second attempt on a loaded machine (the backoff is 1-5 ms).
    retry = dataclasses.replace(FAST, report_stop_s=0.5)
    async with ManagerClient(f"http://127.0.0.1:{port}", retry=retry) as client:
        with pytest.raises(ManagerUnavailable, match="ConnectError") as caught:
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
    retry = dataclasses.replace(FAST, report_stop_s=0.2)
    timeouts = ManagerTimeouts(read_s=0.05)
    try:
        async with ManagerClient(
            f"http://127.0.0.1:{port}", retry=retry, timeouts=timeouts
        ) as client:
            with pytest.raises(ManagerUnavailable, match="ReadTimeout") as caught:
                await client.running("u-1")
    finally:
        server.close()
    assert caught.value.attempts >= 2
    assert accepted >= 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    clock = FakeClock()
    manager.fail("/register", *([httpx.ConnectError] * 3))
    retry = dataclasses.replace(FAST, register_stop_s=0.5, report_stop_s=0.5)
    manager.on_request = lambda _: setattr(clock, "now", clock.now + 40)  # 40 s per attempt
    async with manager.client(retry=retry, clock=clock) as client:
        with capture_logs() as logs:
            await client.register("C.1", 30)  # +40 warns, +80 counted, +120 sums up, +160 back
            manager.fail("/register", *([httpx.ConnectError] * 1000))
            with pytest.raises(ManagerUnavailable):
                await client.register("C.1", 30, stop_s=0.05)
        counts = client.failures
    told = _told(logs)
    assert told[:3] == [("manager.away", "warning"), ("manager.still_away", "warning"),
                        ("manager.back", "info")]  # fmt: skip
    away = next(e for e in logs if e["event"] == "manager.away")
    assert (away["url"], away["call"]) == (URL, "register")
    summary = next(e for e in logs if e["event"] == "manager.still_away")
    assert (summary["failed"], summary["by_call"]) == (2, {"register": 2})
    back = next(e for e in logs if e["event"] == "manager.back")
    assert (back["failed"], back["away_s"]) == (3, 120.0)
    # A new outage after the answer is told at once again.
    assert told[3] == ("manager.away", "warning")
    assert counts.outages == 2
    assert counts.gave_up == 1
    assert counts.failed == counts.by_call["register"] >= 4


async def test_one_outage_is_one_warning_across_calls(manager):
    """A second call that fails in the same outage is not a second warning (before issue 14.3
    each call's first failure was one: a warning every status interval)."""
    clock = FakeClock()
    for path in ("/param-done", "/running"):
        manager.fail(path, *([httpx.ConnectError] * 1000))
    manager.on_request = lambda _: setattr(clock, "now", clock.now + 0.01)
    retry = dataclasses.replace(FAST, report_stop_s=0.1)
    async with manager.client(retry=retry, clock=clock) as client:
        with capture_logs() as logs:
            for call in (lambda: client.param_done("u-1"), lambda: client.running("u-1")):
                with pytest.raises(ManagerUnavailable):
                    await call()
        counts = client.failures
    assert clock.now - 1000 < 60  # all within the first minute of the outage
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
    request = httpx.Request("POST", URL)
    assert is_transient(httpx.ConnectError("x", request=request))
    assert is_transient(httpx.ReadTimeout("x", request=request))
    assert not is_transient(httpx.UnsupportedProtocol("x", request=request))
    assert not is_transient(ManagerRejected("x", 400, "bad"))
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


# --- no manager ---------------------------------------------------------------------------------


async def test_without_a_manager_reports_are_only_logged():
    async with ManagerClient(None) as client:
        assert client.is_local
        with capture_logs() as logs:
            registration = await client.register("C.9", 30)
            await client.param_done(registration.uuid)
            verdict = await client.bench_done(registration.uuid, 1.0)
            await client.running(registration.uuid)
            assert await client.push_logs(registration.uuid, "cuzk", ["x"]) == 0
    assert registration.local
    assert registration.uuid == "local-C.9"
    assert verdict.passed
    assert not verdict.checked
    skipped = [e for e in logs if e["event"] == "manager.report_skipped"]
    assert [e["call"] for e in skipped] == ["register", PARAM_DONE, BENCH_DONE, RUNNING]
    assert skipped[2]["payload"] == {"uuid": "local-C.9", "rate": 1.0}
    assert skipped[2]["judged"] is False
    assert "passed" not in skipped[2]  # nobody judged it: nothing is said about a verdict
    assert "passed" not in skipped[2]["note"]


async def test_a_local_failure_report_is_never_called_a_pass():
    """Issue 14.7: with no manager, the rate-0 failure report used to log ``passed=True ...
    assumed passed``; a failure is now a failure (False), and nothing claims a pass."""
    async with ManagerClient(None) as client:
        with capture_logs() as logs:
            verdict = await client.bench_done("local-C.9", 0.0)
    assert verdict.passed is False
    assert not verdict.checked
    (line,) = [e for e in logs if e["event"] == "manager.report_skipped"]
    assert "passed" not in line
    assert "failure report" in line["note"]
    assert "pass" not in line["note"]


async def test_a_repeated_local_report_is_logged_once():
    """Issue 14.7: the /running ping of a local run logged ``report_skipped`` at every
    interval; the same report again is debug only, a different one is logged."""
    async with ManagerClient(None) as client:
        with capture_logs() as logs:
            for _ in range(5):
                await client.running("local-C.9")
            await client.param_done("local-C.9")
    levels = [(e["call"], e["log_level"]) for e in logs if e["event"] == "manager.report_skipped"]
    assert levels == [(RUNNING, "info"), *[(RUNNING, "debug")] * 4, (PARAM_DONE, "info")]


def test_a_manager_url_needs_a_scheme():
    with pytest.raises(ValueError, match="http"):
        ManagerClient("manager:8080")


# --- the outbox ---------------------------------------------------------------------------------


def open_outbox(path: Path, client: ManagerClient) -> tuple[StateKeeper, Outbox]:
    """What a (re)started supervisor does: load the state file, rebuild the outbox from it."""
    keeper = StateKeeper(StateStore(path))
    return keeper, Outbox.for_keeper(client, keeper)


async def test_a_report_is_on_disk_before_it_is_sent(tmp_path, manager):
    path = tmp_path / "state.json"
    seen_on_disk: list[list[str]] = []
    manager.on_request = lambda _: seen_on_disk.append(
        [r.id for r in StateStore(path).load().outbox]
    )
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        report = Report(kind=PARAM_DONE, uuid="u-1")
        done = await outbox.send_now(report)
    assert seen_on_disk == [[report.id]]
    assert done.outcome == OUTCOME_OK
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert [r.id for r in on_disk.acked] == [report.id]


async def test_a_report_queued_before_a_crash_is_sent_once_after_the_restart(tmp_path, manager):
    path = tmp_path / "state.json"
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        report = Report(kind=RUNNING, uuid="u-1")
        await outbox.enqueue(report)
        # Crash: the process is gone before anything was sent.
    assert manager.requests == []
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        assert [r.id for r in outbox.pending] == [report.id]
        result = await outbox.drain()
    assert [r.id for r in result.sent] == [report.id]
    assert result.pending == 0
    assert result.error is None
    assert manager.paths() == ["/running"]
    assert StateStore(path).load().outbox == ()


async def test_a_crash_during_the_send_resends_after_the_restart(tmp_path):
    path = tmp_path / "state.json"
    first = ScriptedManager()
    first.fail("/bench-done", SimulatedCrash())
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with first.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(SimulatedCrash):
            await outbox.send_now(report)
    second = ScriptedManager()
    async with second.client() as client:
        _, outbox = open_outbox(path, client)
        # The lifecycle resumes: the bench report it queued is still there, with the same id.
        again = outbox.latest(BENCH_DONE)
        assert again is not None
        assert again.id == report.id
        done = await outbox.send_now(again)
    assert done.passed is True
    # The manager's records do not show it applied: it is sent again.
    assert second.paths() == ["/status", "/bench-done"]
    assert json.loads(second.requests[1].content) == {"uuid": "u-1", "rate": 60.0}


async def test_a_verdict_acknowledged_before_a_crash_is_not_sent_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=40.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        first = await outbox.send_now(report)
        # Crash before the lifecycle wrote what it did with the verdict.
    assert first.passed is False
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        known = outbox.latest(BENCH_DONE)
        assert known is not None
        assert known.outcome == OUTCOME_OK
        again = await outbox.send_now(known)
    assert again.passed is False
    assert manager.paths() == ["/bench-done"]


def crash_after_the_answer(path: Path, client: ManagerClient) -> Outbox:
    """An outbox whose process dies right after the manager answered a report, before the
    answer reached the state file (the second save: the first one queued the report)."""
    keeper = StateKeeper(StateStore(path))
    saves = 0

    async def save(pending: tuple[Report, ...], acked: tuple[Report, ...]) -> None:
        nonlocal saves
        saves += 1
        if saves == 2:
            raise SimulatedCrash()
        await keeper.save_outbox(pending, acked)

    return Outbox(client, save)


@pytest.mark.parametrize(("rate", "passed"), [(60.0, True), (40.0, False)])
async def test_a_report_applied_just_before_a_crash_is_not_sent_again(
    tmp_path, manager, rate, passed
):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=rate)
    async with manager.client() as client:
        with pytest.raises(SimulatedCrash):
            await crash_after_the_answer(path, client).send_now(report)
    assert [r.id for r in StateStore(path).load().outbox] == [report.id]
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with capture_logs() as logs:
            result = await outbox.drain()
    # The verdict is read from the manager's records, not asked for a second time.
    assert manager.paths() == ["/bench-done", "/status"]
    assert [(r.id, r.outcome, r.passed) for r in result.sent] == [(report.id, OUTCOME_OK, passed)]
    assert any(e["event"] == "manager.report_reconciled" for e in logs)
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert on_disk.acked[-1].passed is passed
    assert on_disk.acked[-1].finished_at is not None


async def test_param_done_applied_just_before_a_crash_is_not_sent_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=PARAM_DONE, uuid="u-1")
    async with manager.client() as client:
        with pytest.raises(SimulatedCrash):
            await crash_after_the_answer(path, client).send_now(report)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        done = await outbox.send_now(report)
    assert done.outcome == OUTCOME_OK
    assert manager.paths() == ["/param-done", "/status"]


async def test_a_queued_bench_report_is_not_sent_to_an_instance_killed_meanwhile(tmp_path, manager):
    # The manager does not check the state on /bench-done: a resend would revive the instance.
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.record = {"uuid": "u-1", "state": "killed", "min_rate": 50.0,
                      "kill_reason": "benchmark timeout"}  # fmt: skip
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(InstanceGone, match="benchmark timeout"):
            await outbox.send_now(report)
    assert manager.paths() == ["/status"]
    assert StateStore(path).load().acked[-1].outcome == OUTCOME_GONE


@pytest.mark.parametrize("status", [404, 405])
async def test_a_manager_without_a_usable_status_gets_the_report_again(tmp_path, manager, status):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.fail("/status", status)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with capture_logs() as logs:
            done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths() == ["/status", "/bench-done"]
    assert any(e["event"] == "manager.reconcile_skipped" for e in logs)


async def test_a_status_page_mangled_by_a_proxy_is_looked_up_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.record = {"uuid": "u-1", "state": "bench_done", "bench_rate": 60.0, "min_rate": 50.0}
    manager.fail("/status", (200, "<html>proxy</html>"))
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths() == ["/status", "/status"]  # reconciled: not sent again


async def test_a_manager_away_at_the_lookup_keeps_the_report_queued(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=PARAM_DONE, uuid="u-1")
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.fail("/status", *([503] * 1000))
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        result = await outbox.drain(deadline_s=0.1)
        assert result.pending == 1
        assert isinstance(result.error, ManagerUnavailable)
        assert "/param-done" not in manager.paths()
        # Back: looked up, not applied yet, so sent; once.
        manager.steps["/status"].clear()
        result = await outbox.drain()
    assert [r.outcome for r in result.sent] == [OUTCOME_OK]
    assert manager.paths().count("/param-done") == 1


async def test_order_is_kept_across_an_outage(tmp_path, manager):
    path = tmp_path / "state.json"
    manager.fail("/param-done", *([httpx.ConnectError] * 1000))
    reports = [
        Report(kind=PARAM_DONE, uuid="u-1"),
        Report(kind=BENCH_DONE, uuid="u-1", rate=55.0),
        Report(kind=RUNNING, uuid="u-1"),
    ]
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        for report in reports:
            await outbox.enqueue(report)
        result = await outbox.drain(deadline_s=0.05)
        assert isinstance(result.error, ManagerUnavailable)
        assert result.pending == 3
        # The manager is back.
        manager.steps["/param-done"].clear()
        manager.requests.clear()
        result = await outbox.drain()
    assert manager.paths() == ["/param-done", "/bench-done", "/running"]
    assert [r.id for r in result.sent] == [r.id for r in reports]
    assert result.sent[1].passed is True


async def test_send_now_sends_earlier_reports_first_and_returns_the_verdict(tmp_path, manager):
    async with manager.client() as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        await outbox.enqueue(Report(kind=PARAM_DONE, uuid="u-1"))
        done = await outbox.send_now(Report(kind=BENCH_DONE, uuid="u-1", rate=20.0))
    assert manager.paths() == ["/param-done", "/bench-done"]
    assert done.passed is False


async def test_send_now_gives_up_at_its_deadline_and_keeps_the_report(tmp_path, manager):
    path = tmp_path / "state.json"
    # 1000 failures, then an answer; the call's own stop an hour: only send_now's deadline can
    # end it before the answer.
    manager.fail("/bench-done", *([503] * 1000))
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    retry = dataclasses.replace(FAST, report_stop_s=3600.0)
    async with manager.client(retry=retry) as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(ManagerUnavailable):
            await outbox.send_now(report, deadline_s=0.1)
        assert len(manager.requests) < 1000  # the deadline ended it, not the script
        assert [r.id for r in StateStore(path).load().outbox] == [report.id]
        # Trying again with the same report does not queue it twice.
        manager.steps["/bench-done"].clear()
        manager.requests.clear()
        done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths() == ["/bench-done"]
    assert outbox.pending == ()


async def test_instance_gone_is_raised_and_recorded(tmp_path, manager):
    path = tmp_path / "state.json"
    manager.fail("/running", (404, {"error": "instance not found or already killed"}))
    report = Report(kind=RUNNING, uuid="u-1")
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(InstanceGone):
            await outbox.send_now(report)
        # Asked again (e.g. after a restart): the recorded answer, no new request.
        with pytest.raises(InstanceGone):
            await outbox.send_now(report)
    assert len(manager.requests) == 1
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert on_disk.acked[-1].outcome == OUTCOME_GONE


async def test_a_rejected_report_is_dropped_and_the_next_one_still_goes(tmp_path, manager):
    manager.fail("/param-done", (400, {"error": "bad json"}))
    async with manager.client() as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        await outbox.enqueue(Report(kind=PARAM_DONE, uuid="u-1"))
        await outbox.enqueue(Report(kind=RUNNING, uuid="u-1"))
        with capture_logs() as logs:
            result = await outbox.drain()
    assert [r.outcome for r in result.sent] == [OUTCOME_REJECTED, OUTCOME_OK]
    assert manager.paths() == ["/param-done", "/running"]
    assert any(e["event"] == "manager.report_rejected" for e in logs)


async def test_a_report_that_cannot_be_written_is_not_sent(tmp_path, manager):
    blocker = tmp_path / "file"
    blocker.write_text("")
    async with manager.client() as client:
        keeper = StateKeeper(StateStore(blocker / "state.json"))
        outbox = Outbox.for_keeper(client, keeper)
        with pytest.raises(StateWriteError):
            await outbox.send_now(Report(kind=PARAM_DONE, uuid="u-1"))
    assert manager.requests == []
    assert outbox.pending == ()


async def test_acked_reports_are_bounded(tmp_path, manager):
    async with manager.client() as client:
        keeper, outbox = open_outbox(tmp_path / "state.json", client)
        for _ in range(20):
            await outbox.send_now(Report(kind=RUNNING, uuid="u-1"))
    assert len(outbox.acked) == 8
    assert len(keeper.state.acked) == 8


async def test_without_a_manager_the_outbox_completes_locally(tmp_path):
    async with ManagerClient(None) as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        with capture_logs() as logs:
            done = await outbox.send_now(Report(kind=BENCH_DONE, uuid="local-C.1", rate=1.0))
    assert done.passed is True
    assert any(e["event"] == "manager.report_skipped" for e in logs)


async def test_a_json_answer_that_is_not_ok_true_is_not_an_applied_report(manager):
    # A proxy's own JSON (or {"ok": false}) is not the manager applying /running.
    manager.fail("/running", (200, {"status": "maintenance"}), (200, {"ok": False}))
    async with manager.client() as client:
        await client.running("u-1")
    assert manager.paths() == ["/running"] * 3
