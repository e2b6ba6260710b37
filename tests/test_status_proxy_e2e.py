"""A proxy between the supervisor and the manager that answers every ``GET /status`` with
``200 []`` (a cache, a maintenance setup, a manager restarted on an empty database), or with the
fleet's list lacking our record, for the whole lifecycle (issue 22). Neither is evidence of a
kill: the instance reaches ``running``, every report is applied once, and the run exits 0.
Before issue 22 the empty list was read as "the manager no longer knows us" (exit 7, with
``/bench-done`` never sent)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from lifecyclehelpers import lifecycle_env, start_run

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

LABEL = "C.e2e-test"
ANOTHER = {"uuid": "someone-else", "label": "C.9", "runner_id": 1, "state": "running",
           "min_rate": 30, "registered_at": "2026-12-03 08:00:00"}  # fmt: skip


class StatusProxy:
    """Forwards everything to ``upstream``, but ``GET /status`` answers ``mode``'s body."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream = upstream
        self.mode = mode
        self.status_reads = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.command == "GET" and self.path.split("?")[0] == "/status":
                    proxy.status_reads += 1
                    self._answer(200, proxy.status_body(), "application/json")
                    return
                skip = ("host", "content-length", "connection")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                answer = httpx.request(self.command, proxy.upstream + self.path, content=body,
                                       headers=headers, timeout=10)  # fmt: skip
                self._answer(answer.status_code, answer.content,
                             answer.headers.get("Content-Type", "application/json"))  # fmt: skip

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def status_body(self) -> bytes:
        if self.mode == "empty":
            return b"[]"
        try:  # the fleet as the manager lists it (behind the flapping proxy, when it answers)
            listing = httpx.get(self.upstream + "/status", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            listing = []
        if not isinstance(listing, list):
            listing = []
        return json.dumps([r for r in listing if r.get("label") != LABEL] + [ANOTHER]).encode()

    def __enter__(self) -> StatusProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


FLAPPING = ("--html-rate", "0.5", "--html-status", "502", "--bad-body-rate", "0.1")
"""The fault matrix's flaky proxy (HTML 502s on half of the requests, 200s whose body is not the
API's answer), in front of which the status proxy adds its own bodies."""


@pytest.fixture
def status_proxy(manager) -> Iterator[tuple[object, StatusProxy]]:
    def start(mode: str, *manager_args: str) -> tuple[object, StatusProxy]:
        mgr = manager(*manager_args)
        proxy = StatusProxy(mgr.url, mode)
        proxies.append(proxy.__enter__())
        return mgr, proxy

    proxies: list[StatusProxy] = []
    yield start  # type: ignore[misc]
    for proxy in proxies:
        proxy.__exit__()


@pytest.mark.parametrize(
    ("mode", "flapping"),
    [("empty", False), ("others", False), ("empty", True), ("others", True)],
    ids=["empty", "others", "empty-flapping", "others-flapping"],
)
def test_a_status_that_never_lists_us_is_not_a_kill(tmp_path, status_proxy, mode, flapping):
    mgr, proxy = status_proxy(mode, *((*FLAPPING, "--seed", "7") if flapping else ()))
    # Pauses of 0.1-0.5 s, as in the fault matrix's flaky rows, and each read of the table given
    # up after 3 s (the checks depend on neither; the default 30 s would be waited out twice).
    # The table is read at a period before the run phase (manager_status_lookup_s): the check
    # before /bench-done is a /running since issue 43, so by default nothing would read it.
    env = lifecycle_env(tmp_path, proxy.url, exit_after_run="true", bench_count=3,
                        manager_retry_s=300 if flapping else 5, manager_backoff_initial_s=0.1,
                        manager_backoff_max_s=0.5, manager_status_read_s=3,
                        manager_status_lookup_s=1)  # fmt: skip
    run = start_run(env)
    try:
        code = run.wait(100)
    finally:
        run.kill()
    assert code == exitcodes.OK, run.stderr_text()[-2000:]
    assert run.named("manager.instance_gone") == []
    for path in ("/register", "/param-done", "/bench-done", "/running"):
        applied = [
            r
            for r in mgr.requests(path=path)
            if (r.get("applied") or not r.get("faulted")) and 200 <= r["status"] < 300
        ]
        assert len(applied) >= 1, path
        if path in ("/param-done", "/bench-done"):
            assert len(applied) == 1, (path, applied)  # fmt: skip
    (instance,) = mgr.instances()
    assert instance["state"] == "running"
    assert proxy.status_reads >= 1  # it was asked, and its word was not taken as a kill
