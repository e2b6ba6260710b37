"""Issue 31: a proxy's weather never ends a machine; only the manager's own word does.

Every answer shape a proxy (or the manager) gives, on every call that reports and on the log
push: a proxy's HTML, plain and empty 404, a JSON 404 that is not the manager's, 401, 403, 405,
413, 429, 502, 503 pages, a 200 maintenance page and a reset are weather (retried, the report
kept, applied once when the weather clears); the manager's JSON 404 ends the instance on the
reports; its JSON 400 is final with its reason. The pure rules are tested in
``test_core_answers``; the lifecycle's phases in ``test_reporter_weather``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from scripted import FAST, GONE, ScriptedManager, TickingClock, open_outbox
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.values import (
    InstanceGone,
    ManagerRejected,
    ManagerUnavailable,
)
from cuzk_supervisor.adapters.manager.wire import Dropped, HttpAnswer
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE, RUNNING
from cuzk_supervisor.sim.manager.proxy import PROXY_PAGES, RESET, proxy_page

NGINX = {"Server": "nginx/1.25.3"}


class Top:
    """A random source that always draws the top of the range: the longest pauses."""

    def random(self) -> float:
        return 0.999999


def _page(kind: str) -> Any:
    """A proxy page as the scripted manager's step (a reset: the connection dropped)."""
    if kind == RESET:
        return Dropped("connection reset by peer")
    status, body, content_type, headers = proxy_page(kind)
    answered = HttpAnswer(status, {"content-type": content_type or "", **_lower(headers)}, body)
    return (status, answered)


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


WEATHER = {
    **{kind: _page(kind) for kind in PROXY_PAGES},
    "maintenance-200": (200, "<html><title>Down for maintenance</title></html>"),
    "wrong-json-404": (404, {"error": "not found", "status": 404}),
    "manager-404-text-of-another-call": None,  # filled per path below
    "json-500": (500, {"error": "database is locked"}),
}
"""Every answer that is not the manager's word, by name."""

CALLS: dict[str, Callable[[ManagerClient], Awaitable[Any]]] = {
    "/param-done": lambda c: c.param_done("u-1"),
    "/bench-done": lambda c: c.bench_done("u-1", 60.0),
    "/running": lambda c: c.running("u-1"),
    "/register": lambda c: c.register("C.1", 30.0),
    "/status": lambda c: c.instance_record("u-1"),
}


def weather_step(kind: str, path: str) -> Any:
    """The scripted manager's step for the answer ``kind`` on ``path``."""
    if kind == "manager-404-text-of-another-call":
        other = "/running" if path != "/running" else "/param-done"
        return (404, GONE[other])
    return WEATHER[kind]


@pytest.mark.parametrize("kind", sorted(WEATHER))
@pytest.mark.parametrize("path", sorted(CALLS))
async def test_weather_on_a_call_is_retried_and_the_call_applied_once_it_clears(path, kind):
    manager = ScriptedManager()
    manager.record = {"uuid": "u-1", "state": "registered"}
    manager.fail(path, *[weather_step(kind, path)] * 3)
    async with manager.client() as client:
        with capture_logs() as logs:
            await CALLS[path](client)
        assert client.failures.failed == 3
    assert manager.paths() == [path] * 4  # three pages, then the manager's answer, once
    away = next(e for e in logs if e["event"] == "manager.away")
    if kind != RESET:
        # The warning names what answered: its status, its Server header, its first line.
        assert away["reason"].startswith("HTTP ")
        if kind.startswith("html"):
            assert "from nginx/1.25.3" in away["reason"]
            assert f'"{kind[4:]} ' in away["reason"]  # the page's title: "404 Not Found"


@pytest.mark.parametrize("kind", sorted(WEATHER))
async def test_weather_on_the_log_push_keeps_the_lines(kind):
    """The push is one attempt: the caller (the shipper) keeps its lines for its next turn."""
    manager = ScriptedManager()
    manager.fail("/api/log-push", weather_step(kind, "/api/log-push"))
    # The first pause of the shared backoff: 1,000 s (full jitter, the top draw).
    retry = dataclasses.replace(FAST, backoff_base_s=1000.0, backoff_max_s=1000.0)
    async with manager.client(retry=retry, rng=Top()) as client:
        with pytest.raises(ManagerUnavailable):
            await client.push_logs("u-1", "setup", ["a line"])
        assert manager.paths() == ["/api/log-push"]
        # Not again before the shared backoff allows it: no request at all.
        with pytest.raises(ManagerUnavailable, match="backoff"):
            await client.push_logs("u-1", "setup", ["a line"])
        assert manager.paths() == ["/api/log-push"]


@pytest.mark.parametrize("path", ["/param-done", "/bench-done", "/running"])
async def test_only_the_managers_json_404_ends_the_instance(path):
    manager = ScriptedManager()
    manager.fail(path, (404, GONE[path]))
    async with manager.client() as client:
        with pytest.raises(InstanceGone, match=GONE[path]["error"]):
            await CALLS[path](client)
    assert manager.paths() == [path]


@pytest.mark.parametrize("path", ["/register", "/status", "/api/log-push"])
async def test_the_managers_404_text_on_a_call_that_never_says_it_is_weather(path):
    manager = ScriptedManager()
    manager.record = {"uuid": "u-1", "state": "registered"}
    manager.fail(path, (404, {"error": "instance not found"}))
    call = CALLS.get(path, lambda c: c.push_logs("u-1", "setup", ["x"]))
    async with manager.client() as client:
        if path == "/api/log-push":
            with pytest.raises(ManagerUnavailable):
                await call(client)
        else:
            await call(client)
    assert manager.paths()[0] == path


@pytest.mark.parametrize("path", [*sorted(CALLS), "/api/log-push"])
async def test_the_managers_json_400_is_final_with_its_reason(path):
    manager = ScriptedManager()
    manager.record = {"uuid": "u-1", "state": "registered"}
    manager.fail(path, (400, {"error": "bad request: unexpected EOF"}))
    call = CALLS.get(path, lambda c: c.push_logs("u-1", "setup", ["x"]))
    async with manager.client() as client:
        with pytest.raises(ManagerRejected, match="bad request: unexpected EOF") as caught:
            await call(client)
    assert caught.value.status == 400
    assert manager.paths() == [path]


async def test_a_proxy_400_page_is_weather_not_the_managers_word():
    manager = ScriptedManager()
    manager.fail("/running", _page("html400"))
    async with manager.client() as client:
        await client.running("u-1")
    assert manager.paths() == ["/running", "/running"]


@pytest.mark.parametrize("kind", sorted(WEATHER))
@pytest.mark.parametrize(("kind_of", "rate"), [(PARAM_DONE, None), (BENCH_DONE, 60.0),
                                               (RUNNING, None)])  # fmt: skip
async def test_a_queued_report_outlives_weather_and_is_applied_once(tmp_path, kind, kind_of, rate):
    """Weather for longer than a send's stop: the report stays in the outbox, durable, and the
    next drain applies it once."""
    manager = ScriptedManager()
    path = {PARAM_DONE: "/param-done", BENCH_DONE: "/bench-done", RUNNING: "/running"}[kind_of]
    manager.fail(path, *[weather_step(kind, path)] * 1000)
    retry = dataclasses.replace(FAST, report_stop_s=25.0)
    async with manager.client(retry=retry, clock=TickingClock(manager, 10.0)) as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        await outbox.enqueue(Report(kind=kind_of, uuid="u-1", rate=rate))
        result = await outbox.drain()
        assert result.pending == 1
        assert isinstance(result.error, ManagerUnavailable)
        manager.steps[path].clear()  # the weather clears
        manager.requests.clear()
        result = await outbox.drain()
    assert [r.outcome for r in result.sent] == [OUTCOME_OK]
    assert manager.paths() == [path]


async def test_a_sustained_episode_is_one_line_and_its_end_another():
    """Half the requests answered by a proxy's 404 page for a long time: one warning once it
    has lasted ``weather_s``, one line when it is over; never a line per answer."""
    manager = ScriptedManager()
    flip = [True]

    def page_every_other(request: Any) -> None:
        flip[0] = not flip[0]
        if flip[0]:
            manager.fail(request.url.path, _page("html404"))

    clock = TickingClock(manager, 30.0)  # 30 s between requests

    def on_request(request: Any) -> None:
        clock.tick()
        page_every_other(request)

    manager.on_request = on_request
    heard: list[tuple[bool, str]] = []
    retry = dataclasses.replace(FAST, report_stop_s=1000.0)
    async with manager.client(clock=clock, weather_s=600.0, retry=retry) as client:
        client.add_weather_listener(lambda *args: heard.append(args))
        with capture_logs() as logs:
            for _ in range(30):  # 15 min, every other request a page
                await client.running("u-1")
            assert client.weather_sustained
            manager.on_request = lambda _: clock.tick()
            for _ in range(15):  # 7.5 min of the manager's own answers
                await client.running("u-1")
    said = [e for e in logs if e["event"].startswith("manager.weather")]
    assert [e["event"] for e in said] == ["manager.weather", "manager.weather_over"]
    assert said[0]["log_level"] == "warning"
    assert "404 Not Found" in said[0]["last"]
    assert said[0]["by_status"] == {404: said[0]["answers"]}
    assert [sustained for sustained, _ in heard] == [True, False]
    assert not client.weather_sustained


def test_a_sustained_episode_shows_in_the_metrics():
    from cuzk_supervisor.serve.metrics import SupervisorMetrics

    metrics = SupervisorMetrics()
    assert b"cuzk_supervisor_manager_weather 0.0" in metrics.render()
    metrics.manager_weather(True, 'HTTP 404 from nginx: "404 Not Found"')
    assert b"cuzk_supervisor_manager_weather 1.0" in metrics.render()
    metrics.manager_weather(False, "")
    assert b"cuzk_supervisor_manager_weather 0.0" in metrics.render()
