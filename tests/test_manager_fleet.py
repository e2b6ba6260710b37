"""The manager client's fleet manners (issue 22), against the scripted manager (``scripted``):
429 and 503 transient for every call, ``Retry-After`` honoured in both
forms, one backoff shared by all calls, one probe at a time while the manager fails, no report
dropped for a 429, and a ``GET /status`` that is empty or lacks our record never taken as a kill.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest
from pacehelpers import patient
from scripted import FAST, OTHER, URL, ScriptedManager, TickingClock, open_outbox
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import ManagerUnavailable
from cuzk_supervisor.adapters.manager.wire import FunctionTransport, HttpAnswer, HttpRequest
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.adapters.state.store import StateStore
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE

NOW = datetime(2026, 12, 3, 8, 0, 0, tzinfo=UTC).timestamp()


class Top:
    """A random source that always draws the top of the range: the longest pauses."""

    def random(self) -> float:
        return 0.999999


@pytest.fixture
def manager() -> ScriptedManager:
    return ScriptedManager()


def stamped(manager: ScriptedManager) -> list[tuple[str, float]]:
    """Record (path, monotonic time) of every request."""
    seen: list[tuple[str, float]] = []
    manager.on_request = lambda request: seen.append((request.url.path, time.monotonic()))
    return seen


CALLS = {
    "/register": lambda c: c.register("C.1", 30),
    "/param-done": lambda c: c.param_done("u-1"),
    "/bench-done": lambda c: c.bench_done("u-1", 60.0),
    "/running": lambda c: c.running("u-1"),
    "/status": lambda c: c.instance_record("u-1"),
    "/api/log-push": lambda c: c.push_logs("u-1", "setup", ["a line"]),
}


@pytest.mark.parametrize("status", [429, 503, 408])
@pytest.mark.parametrize("path", [path for path in CALLS if path != "/api/log-push"])
async def test_429_and_503_are_transient_for_every_call(manager, path, status):
    """Before issue 22 a 429 was final: a queued report dropped, register ending the process,
    kill look-ups off for good. (The log push is one attempt, its lines kept by the shipper:
    test_manager_weather.)"""
    manager.record = {"uuid": "u-1", "state": "registered"}
    manager.fail(path, (status, "<html>Too Many Requests</html>"), status)
    async with manager.client() as client:
        await CALLS[path](client)
        counts = client.failures
    assert manager.paths() == [path] * 3
    assert counts.failed == 2
    assert dict(counts.by_reason) == {f"HTTP {status}": 2}


@pytest.mark.parametrize(
    "header",
    ["1", format_datetime(datetime.fromtimestamp(NOW + 1, UTC), usegmt=True)],
    ids=["seconds", "http-date"],
)
@pytest.mark.parametrize("status", [429, 503])
async def test_no_request_before_its_retry_after(manager, header, status):
    manager.fail("/bench-done", (status, {"error": "slow down"}))
    seen = stamped(manager)
    original = manager.handler

    def with_header(request: HttpRequest) -> HttpAnswer:
        response = original(request)
        if response.status == status:
            response = dataclasses.replace(
                response, headers={**response.headers, "retry-after": header}
            )
        return response

    client_kwargs: dict[str, Any] = {"wall_clock": lambda: NOW}
    async with ScriptedManagerClient(manager, with_header, **client_kwargs) as client:
        verdict = await client.bench_done("u-1", 60.0)
        # The floor holds for every call, not only the one that was told.
        assert client.backoff.wait_s(seen[0][1]) >= 1.0 - 0.05
        assert client.failures.retry_after == 1
    assert verdict.passed
    assert [path for path, _ in seen] == ["/bench-done"] * 2
    assert seen[1][1] - seen[0][1] >= 1.0


def ScriptedManagerClient(manager: ScriptedManager, handler: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("retry", FAST)
    return ManagerClient(URL, transport=FunctionTransport(handler), **kwargs)


async def test_one_backoff_is_shared_by_all_calls_and_not_restarted_per_call(manager):
    """A call that starts while the manager is failing continues the backoff other calls grew
    (before issue 22 every call started again at the first, shortest pause)."""
    # Real time: pauses of 0.1 s and up, so that a loaded machine's late wake-ups (tens of ms
    # per attempt with eight test processes on two cores) do not change how many fit the stop.
    retry = dataclasses.replace(FAST, backoff_base_s=0.1, backoff_max_s=1.6, report_stop_s=3.0)
    manager.fail("/param-done", *([503] * 3))
    manager.fail("/running", 503)
    seen = stamped(manager)
    async with manager.client(retry=retry, rng=Top()) as client:
        with pytest.raises(ManagerUnavailable):
            # 0.1, 0.2 waited; the next pause (0.4) would end past its stop
            await client.param_done("u-1", stop_s=0.5)
        grown = client.backoff.failures
        await client.running("u-1")  # starts with the pause the outage reached, not 0.1
        assert client.backoff.failures == 0  # answered: reset
    assert grown == 3
    running = [at for path, at in seen if path == "/running"]
    last_param_done = [at for path, at in seen if path == "/param-done"][-1]
    assert running[0] - last_param_done >= 0.4 * 0.99  # the shared pause after 3 failures
    assert running[1] - running[0] >= 0.8 * 0.99  # and doubled again after the 4th


async def test_while_the_manager_fails_one_request_at_a_time_probes_it():
    in_flight = peak = failed = 0
    failing = True

    async def handler(request: HttpRequest) -> HttpAnswer:
        nonlocal in_flight, peak, failed
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        if failing:
            failed += 1
            return HttpAnswer.of_json(503, {"error": "down"})
        return HttpAnswer.of_json(200, {"ok": True, "passed": True})

    # Stops that only a hang reaches: the three calls keep probing until the manager is back.
    retry = dataclasses.replace(FAST, report_stop_s=patient(30), log_stop_s=patient(30))
    async with ScriptedManagerClient(ScriptedManager(), handler, retry=retry) as client:
        with pytest.raises(ManagerUnavailable):
            await client.param_done("u-1", stop_s=0.05)  # the manager is failing now
        peak = failed = 0
        # (A log push does not wait: held back by the backoff, it says so at once.)
        calls = [client.running("u-1"), client.param_done("u-1"), client.bench_done("u-1", 60)]
        tasks = [asyncio.create_task(call) for call in calls]
        # The manager comes back once the calls have probed it a few times while it failed
        # (counted, not timed).
        deadline = time.monotonic() + patient(30)
        while failed < 6:
            assert time.monotonic() < deadline, f"only {failed} probes while failing"
            await asyncio.sleep(0.01)
        failing = False
        await asyncio.gather(*tasks)
    assert peak == 1


async def test_a_429_never_drops_a_queued_report(tmp_path, manager):
    """Before issue 22 a 429 finished a report as rejected: /param-done or /bench-done lost."""
    path = tmp_path / "state.json"
    manager.fail("/param-done", *([429] * 1000))
    manager.fail("/bench-done", 429, 429)
    retry = dataclasses.replace(FAST, report_stop_s=0.05)
    async with manager.client(retry=retry) as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(Report(kind=PARAM_DONE, uuid="u-1"))
        result = await outbox.drain()
        assert isinstance(result.error, ManagerUnavailable)
        assert result.sent == ()
        assert [r.kind for r in StateStore(path).load().outbox] == [PARAM_DONE]
        manager.steps["/param-done"].clear()  # the proxy lets us through again
        done = await outbox.send_now(Report(kind=BENCH_DONE, uuid="u-1", rate=60.0))
    assert done.passed is True
    assert [r.outcome for r in outbox.acked] == [OUTCOME_OK, OUTCOME_OK]
    assert manager.paths().count("/bench-done") == 3


async def test_an_empty_status_is_a_bad_answer_retried_and_counted(manager):
    manager.record = {"uuid": "u-1", "state": "params_done"}
    manager.fail("/status", (200, []), (200, []))
    async with manager.client() as client:
        record = await client.instance_record("u-1")
        counts = client.failures
    assert record == manager.record
    assert manager.paths() == ["/status"] * 3
    assert dict(counts.by_reason) == {"bad answer": 2}


async def test_a_status_always_empty_is_unavailable_not_a_kill(manager):
    manager.fail("/status", *([(200, [])] * 1000))
    retry = dataclasses.replace(FAST, report_stop_s=0.05)
    async with manager.client(retry=retry) as client:
        with pytest.raises(ManagerUnavailable) as caught:
            await client.instance_record("u-1")
    assert caught.value.bad_answer
    assert "empty list" in caught.value.reason


async def test_a_status_without_our_record_is_no_evidence(manager):
    manager.record = None  # the listing holds another instance only
    async with manager.client() as client:
        with capture_logs() as logs:
            assert await client.instance_record("u-1") is None
        assert client.unlisted == 1
    assert any(e["event"] == "manager.status_unlisted" for e in logs)
    assert manager.paths() == ["/status"]
    assert OTHER["uuid"] != "u-1"


async def test_a_queued_report_is_sent_when_status_never_answers_a_usable_list(tmp_path, manager):
    """A proxy answering every GET /status with 200 []: the report left queued by a crash is
    sent (at least once) rather than held forever."""
    path = tmp_path / "state.json"
    report = Report(kind=PARAM_DONE, uuid="u-1")
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.fail("/status", *([(200, [])] * 1000))
    retry = dataclasses.replace(FAST, report_stop_s=0.05)
    async with manager.client(retry=retry) as client:
        _, outbox = open_outbox(path, client)
        with capture_logs() as logs:
            done = await outbox.send_now(report)
    assert done.outcome == OUTCOME_OK
    assert manager.paths()[-1] == "/param-done"
    assert manager.paths().count("/param-done") == 1
    assert any(e["event"] == "manager.reconcile_skipped" for e in logs)


async def test_a_flapping_proxy_is_a_line_or_two_a_minute_not_one_per_failure(manager):
    """Fails, answers, fails...: every failure begins a new outage; they are counted, and told
    at most about once a minute (each line is shipped to the manager too)."""
    clock = TickingClock(manager, 1.0)  # 1 s per request
    async with manager.client(clock=clock) as client:
        with capture_logs() as logs:
            for _ in range(120):  # four minutes
                manager.fail("/running", 503)
                await client.running("u-1")
        counts = client.failures
    assert counts.failed == counts.outages == 120
    loud = [e for e in logs if e["log_level"] in ("warning", "info")
            and e["event"].startswith("manager.") and e["event"] != "manager.call_ok"]  # fmt: skip
    assert len(loud) <= 2 * 4 + 2, [e["event"] for e in loud]
    # What was told adds up to the failures but those since the last line (at most a minute).
    assert sum(e.get("failed", 0) for e in loud if e["event"] == "manager.away") >= 120 - 60
