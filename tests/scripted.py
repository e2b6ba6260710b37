"""A scripted manager for the manager client's tests: a
:class:`~cuzk_supervisor.adapters.manager.wire.FunctionTransport` handler that answers like the
real manager (docs/manager-api.md) unless a test queues failures for a path: a status code
(with the manager-like JSON ``{"error": "scripted"}``), a ``(status, body)`` pair (a dict is
JSON, a str is plain text, an :class:`HttpAnswer` is sent as it is), or a transport error to
raise (no answer: refused, timed out, dropped). Backoff is shrunk to milliseconds (``FAST``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import ManagerRetry
from cuzk_supervisor.adapters.manager.wire import (
    FunctionTransport,
    HttpAnswer,
    HttpRequest,
    TimedOut,
    TransportError,
)
from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore

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
GONE = {
    "/param-done": {"error": "instance not found"},
    "/bench-done": {"error": "instance not found"},
    "/running": {"error": "instance not found or already killed"},
}
"""The manager's own 404 bodies (docs/manager-api.md)."""
FULL_LOGS: dict[str, Any] = {
    "log_push_early_interval_s": 0.5,
    "log_push_interval_s": 0.5,
    "log_budget_bytes_per_min": 500_000,
    "log_run_budget_bytes_per_min": 500_000,
}
"""Settings under which a run's lines reach the manager's tabs at once and whole: for the
end-to-end tests that read the dashboard, whose lifecycles last seconds (the budget of a
real machine, 12 KB a minute in turns every 20 s, would summarise most of their lines)."""


class SimulatedCrash(BaseException):
    """The supervisor process dies here."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TickingClock:
    """The event loop's clock (so the client's waits end as they should) plus ``step_s`` more
    at each request the scripted manager sees: a retry stop is reached after a known number of
    attempts, however slow or loaded the machine (its own time counts for milliseconds)."""

    def __init__(self, manager: ScriptedManager, step_s: float) -> None:
        self.extra = 1000.0
        self.step_s = step_s
        manager.on_request = lambda _: self.tick()

    def tick(self) -> None:
        self.extra += self.step_s

    def __call__(self) -> float:
        return asyncio.get_running_loop().time() + self.extra


class Seen:
    """A request as the tests read it: ``url.path``, ``content``, ``headers``, ``method``."""

    def __init__(self, request: HttpRequest) -> None:
        self.request = request
        self.method = request.method
        self.content = request.body
        self.path = request.target.split("?", 1)[0]
        self.headers = {name: value for name, value in request.headers}

    @property
    def url(self) -> Seen:
        return self


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> HttpAnswer:
    """An answer: a dict or list body as JSON, a str as plain text (HTML if it starts with
    ``<``), None as the manager-like JSON error ``{"error": "scripted"}``."""
    if isinstance(body, HttpAnswer):
        return body
    if body is None:
        body = {"error": "scripted"}
    if isinstance(body, dict | list):
        return HttpAnswer.of_json(status, body, headers)
    kind = "text/html" if body.lstrip().startswith("<") else "text/plain; charset=utf-8"
    return HttpAnswer.of_text(status, body, kind, headers)


def scripted_error(step: Any) -> BaseException | None:
    if isinstance(step, BaseException):
        return step
    if isinstance(step, type) and issubclass(step, TimedOut):
        return step("read", 0.01)
    if isinstance(step, type) and issubclass(step, TransportError):
        return step("scripted")
    return None


class ScriptedManager:
    """A FunctionTransport handler: real-manager answers, with scripted failures first."""

    def __init__(self, min_rate: float = 50.0) -> None:
        self.min_rate = min_rate
        self.requests: list[Seen] = []
        self.steps: dict[str, list[Any]] = defaultdict(list)
        self.on_request: Any = None
        # The instance's record as GET /status lists it, kept as the real manager keeps it.
        self.record: dict[str, Any] | None = None

    def fail(self, path: str, *steps: Any) -> None:
        self.steps[path].extend(steps)

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]

    def handler(self, request: HttpRequest) -> HttpAnswer:
        seen = Seen(request)
        self.requests.append(seen)
        if self.on_request is not None:
            self.on_request(seen)
        path = seen.path
        if self.steps[path]:
            step = self.steps[path].pop(0)
            error = scripted_error(step)
            if error is not None:
                raise error
            status, body = step if isinstance(step, tuple) else (step, None)
            return answer(status, body)
        return self.answer(path, seen)

    def answer(self, path: str, request: Seen) -> HttpAnswer:
        if path == "/api/log-push":
            return HttpAnswer(204)
        if path == "/status":
            # The manager lists every instance it knows: another one of the fleet, and ours.
            return answer(200, [OTHER, *([self.record] if self.record else [])])
        body = json.loads(request.content)
        if path == "/register":
            self.record = self.record or {
                "uuid": "u-1", "state": "registered", "min_rate": self.min_rate,
            }  # fmt: skip
            return answer(200, {"uuid": "u-1", "runner_id": 7})
        record = self.record or {"uuid": body["uuid"], "state": "registered"}
        record["min_rate"] = self.min_rate
        self.record = record
        if record["state"] == "killed" and path == "/running":
            return answer(404, GONE[path])
        if path == "/param-done":
            if record["state"] == "registered":
                record.update(state="params_done", param_done_at=time.time())
            return answer(200, {"ok": True})
        if path == "/running":
            record["state"] = "running"
            return answer(200, {"ok": True})
        if path == "/bench-done":
            passed = body["rate"] >= self.min_rate
            if passed:
                record.update(state="bench_done", bench_rate=body["rate"], bench_done_at=1.0)
            else:
                record.update(state="killed", kill_reason="bench failed", killed_at=1.0)
            return answer(200, {"ok": True, "passed": passed})
        return answer(404, "404 page not found\n")

    def client(self, **kwargs: Any) -> ManagerClient:
        kwargs.setdefault("retry", FAST)
        return ManagerClient(URL, transport=FunctionTransport(self.handler), **kwargs)


def open_outbox(path: Path, client: ManagerClient) -> tuple[StateKeeper, Outbox]:
    """What a (re)started supervisor does: load the state file, rebuild the outbox from it."""
    keeper = StateKeeper(StateStore(path))
    return keeper, Outbox.for_keeper(client, keeper)
