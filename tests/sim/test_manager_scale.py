"""The simulated manager as the real one at fleet scale: ``GET /status`` answers the whole
table (killed rows kept) every time, a proxy in front can throttle a share of requests (429 or
503, ``Retry-After`` in seconds, as an HTTP-date, or none), and it counts what it was asked and
what that cost it (requests and bytes per endpoint, reports applied per instance, lines written
into its own log): what ``bench/fleet.py`` reads."""

from __future__ import annotations

import email.utils
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from managerhelpers import ManagerFactory, ManagerProcess, poll_until

from cuzk_supervisor.sim.manager.counters import Counters
from cuzk_supervisor.sim.manager.faults import (
    THROTTLE_KIND,
    FaultError,
    Faults,
    FaultSettings,
    validate,
)
from cuzk_supervisor.sim.manager.proxy import retry_after_value


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


def counters(mgr: ManagerProcess, reports: bool = False) -> dict[str, Any]:
    response = mgr.get("/sim/counters", params={"reports": 1} if reports else None)
    assert response.status_code == 200, response.text
    return dict(response.json())


def raw_exchange(mgr: ManagerProcess, request: bytes) -> bytes:
    """Send ``request`` as is on a new connection (``Connection: close``); the whole answer."""
    host, _, port = mgr.listen.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# --- GET /status: the whole table, killed rows kept ---------------------------------------------
def test_status_answers_every_record_killed_ones_included(start: ManagerFactory) -> None:
    mgr = start()
    uuids = [mgr.register(f"C.{n}", 10)["uuid"] for n in range(5)]
    assert mgr.post("/api/kill", json={"uuid": uuids[0]}).json() == {"ok": True}
    failed = mgr.post("/bench-done", json={"uuid": uuids[1], "rate": 1})
    assert failed.json() == {"ok": True, "passed": False}
    listed = mgr.status()
    assert [r["uuid"] for r in listed] == list(reversed(uuids))  # runner id, highest first
    states = {r["uuid"]: r["state"] for r in listed}
    assert states[uuids[0]] == states[uuids[1]] == "killed"
    assert {states[u] for u in uuids[2:]} == {"registered"}
    # A killed label registers anew: both rows stay listed.
    again = mgr.register("C.0", 10)["uuid"]
    assert again != uuids[0]
    assert [r["uuid"] for r in mgr.status()][:1] == [again]
    assert len(mgr.status()) == 6


def test_status_follows_every_write_at_once(start: ManagerFactory) -> None:
    """Its body is cached between writes: every kind of write shows in the next answer."""
    mgr = start()
    uuid = mgr.register("C.1", 10)["uuid"]
    first = mgr.get("/status").content
    assert mgr.get("/status").content == first
    mgr.post("/param-done", json={"uuid": uuid})
    assert mgr.status()[0]["state"] == "params_done"
    mgr.post("/bench-done", json={"uuid": uuid, "rate": 20})
    assert mgr.status()[0]["bench_rate"] == 20
    mgr.post("/running", json={"uuid": uuid})
    assert mgr.status()[0]["state"] == "running"
    mgr.kill_instance(uuid, "gone")
    assert mgr.status()[0]["kill_reason"] == "gone"


def test_status_bytes_grow_with_the_table(start: ManagerFactory) -> None:
    """About 290 bytes a row at the real one; what a fleet polling it pays, counted."""
    mgr = start()
    for n in range(40):
        mgr.register(f"C.{n}", 30)
    before = counters(mgr)["endpoints"].get("/status", {"bytes_out": 0})["bytes_out"]
    body = mgr.get("/status").content
    after = counters(mgr)["endpoints"]["/status"]["bytes_out"]
    assert 40 * 150 < len(body) < 40 * 300
    assert len(body) < after - before < len(body) + 400  # the body and its headers


# --- counters -------------------------------------------------------------------------------------
def test_counters_count_requests_and_exact_bytes_both_ways(start: ManagerFactory) -> None:
    mgr = start()
    body = b'{"label":"C.7","min_rate":0}'
    request = (
        b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    answer = raw_exchange(mgr, request)
    assert answer.startswith(b"HTTP/1.1 200")
    seen = counters(mgr)
    reg = seen["endpoints"]["/register"]
    assert (reg["requests"], reg["bytes_in"], reg["bytes_out"]) == (1, len(request), len(answer))
    assert reg["statuses"] == {"200": 1}
    assert reg["applied"] == 1
    assert seen["totals"]["requests"] == 1  # /sim/ requests are not counted


def test_counters_per_endpoint_with_statuses_and_unknown_paths(start: ManagerFactory) -> None:
    mgr = start()
    uuid = mgr.register("C.1", 10)["uuid"]
    mgr.post("/running", json={"uuid": uuid})
    mgr.post("/running", json={"uuid": "nope"})
    mgr.get("/status")
    mgr.get(f"/api/instance-logs/{uuid}")
    mgr.get("/no/such/path")
    mgr.get("/running")  # wrong method
    ep = counters(mgr)["endpoints"]
    assert ep["/running"]["requests"] == 3
    assert ep["/running"]["statuses"] == {"200": 1, "404": 1, "405": 1}
    assert ep["/status"]["requests"] == 1
    assert ep["/api/instance-logs/"]["requests"] == 1
    assert ep["other"]["requests"] == 1


def test_reports_applied_per_instance_tell_lost_from_twice(start: ManagerFactory) -> None:
    mgr = start()
    a, b = mgr.register("C.1", 10)["uuid"], mgr.register("C.2", 10)["uuid"]
    mgr.post("/param-done", json={"uuid": a})
    mgr.post("/bench-done", json={"uuid": a, "rate": 20})
    mgr.post("/bench-done", json={"uuid": a, "rate": 20})
    mgr.faults(fail_next=1)
    assert mgr.post("/param-done", json={"uuid": b}).status_code == 503  # not applied
    mgr.post("/param-done", json={"uuid": "unknown"})  # 404: not applied
    reports = counters(mgr, reports=True)["reports"]
    assert reports["/param-done"] == {a: 1}
    assert reports["/bench-done"] == {a: 2}
    assert reports["/running"] == {}
    assert "reports" not in counters(mgr)


def test_each_running_writes_one_line_into_the_managers_own_log(start: ManagerFactory) -> None:
    mgr = start()
    uuid = mgr.register("C.1", 10)["uuid"]
    before = counters(mgr)["manager_log"]
    for _ in range(7):
        mgr.post("/running", json={"uuid": uuid})
    after = counters(mgr)["manager_log"]
    assert after["running_lines"] - before["running_lines"] == 7
    assert after["lines_written"] - before["lines_written"] == 7
    assert after["keep"] == 5000
    lines = [line for line in mgr.manager_log() if "[running]" in line]
    assert len(lines) == 7


def test_instance_log_lines_received_dropped_and_kept(start: ManagerFactory) -> None:
    mgr = start()
    uuid = mgr.register("C.1", 10)["uuid"]
    headers = {"X-Instance-UUID": uuid, "X-Log-Source": "setup"}
    for part in range(11):
        text = "".join(f"line {part}-{n}\n" for n in range(1000))
        assert mgr.post("/api/log-push", content=text, headers=headers).status_code == 204
    logs = counters(mgr)["instance_logs"]
    assert logs == {
        "instances": 1,
        "lines_received": 11_000,
        "lines_dropped": 1_000,  # the ring keeps 10,000 and drops its oldest 1,000 at once
        "lines_kept": 10_000,
    }


# --- throttling ------------------------------------------------------------------------------
def test_throttled_answer_is_a_proxys_429_with_retry_after_and_not_applied(
    start: ManagerFactory,
) -> None:
    mgr = start("--throttle-rate", "1", "--retry-after", "30")
    r = mgr.post("/register", json={"label": "C.1"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "30"
    assert r.headers["content-type"] == "text/html"
    assert "429 Too Many Requests" in r.text
    assert mgr.instances() == []  # a proxy answered: the manager never saw it
    entry = mgr.requests(path="/register")[-1]
    assert (entry["faulted"], entry["fault"], entry["applied"]) == (True, "throttle", False)
    reg = counters(mgr)["endpoints"]["/register"]
    assert (reg["throttled"], reg["faulted"], reg["applied"]) == (1, 1, 0)


def test_retry_after_as_an_http_date_never_earlier_than_asked(start: ManagerFactory) -> None:
    mgr = start("--throttle-rate", "1", "--retry-after", "45", "--retry-after-form", "date")
    asked_at = time.time()
    r = mgr.get("/status")
    assert r.status_code == 429
    when = email.utils.parsedate_to_datetime(r.headers["retry-after"]).timestamp()
    assert r.headers["retry-after"].endswith(" GMT")
    assert asked_at + 45 - 1 <= when <= time.time() + 46


def test_throttle_503_without_retry_after(start: ManagerFactory) -> None:
    mgr = start("--throttle-rate", "1", "--throttle-status", "503", "--retry-after-form", "none")
    r = mgr.get("/status")
    assert r.status_code == 503
    assert "retry-after" not in r.headers
    assert "503" in r.text


def test_throttle_a_share_for_a_while_then_stop(start: ManagerFactory) -> None:
    mgr = start("--seed", "5")
    settings = mgr.faults(throttle_rate=0.5, throttle_for=30)
    assert settings["throttle_rate"] == 0.5
    assert 0 < settings["throttle_left"] <= 30
    statuses = [mgr.get("/status").status_code for _ in range(200)]
    assert set(statuses) == {200, 429}
    assert 70 <= statuses.count(429) <= 130
    mgr.faults(throttle_rate=0.5, throttle_for=0.2)
    poll_until(lambda: mgr.faults()["throttle_rate"] == 0.0, 5)
    assert mgr.faults()["throttle_left"] is None
    assert {mgr.get("/status").status_code for _ in range(50)} == {200}


def test_throttle_by_environment_and_limited_to_paths(start: ManagerFactory) -> None:
    env = json.dumps({"throttle_rate": 1, "paths": ["/running"], "retry_after": 2.5})
    mgr = start(env={"CUZK_SIM_MANAGER_FAULTS": env})
    uuid = mgr.register("C.1", 10)["uuid"]
    r = mgr.post("/running", json={"uuid": uuid})
    assert (r.status_code, r.headers["retry-after"]) == (429, "3")  # whole seconds, rounded up
    assert mgr.get("/sim/counters").status_code == 200


def test_bad_throttle_settings_are_refused(start: ManagerFactory) -> None:
    for bad in (
        {"throttle_rate": 2},
        {"retry_after_form": "minutes"},
        {"throttle_status": 200},
        {"retry_after": -1},
    ):
        with pytest.raises(FaultError):
            validate(bad)
    mgr = start()
    with httpx.Client(base_url=mgr.url) as client:
        r = client.post("/sim/faults", json={"retry_after_form": "minutes"})
    assert r.status_code == 400


# --- in process ----------------------------------------------------------------------------------
def test_faults_throttle_decision_carries_its_retry_after() -> None:
    faults = Faults(FaultSettings(throttle_rate=1.0, retry_after=12.0, seed=1))
    decision = faults.decide("/bench-done")
    assert (decision.kind, decision.status, decision.apply) == (THROTTLE_KIND, 429, False)
    assert (decision.retry_after, decision.retry_after_form) == (12.0, "seconds")
    assert decision.delay_before == decision.delay_after == 0.0
    assert retry_after_value("seconds", 0.2, 0) == "1"
    assert retry_after_value("none", 30, 0) is None
    assert retry_after_value("date", 30, 0) == "Thu, 01 Jan 1970 00:00:30 GMT"


def test_counters_snapshot_sums_and_copies() -> None:
    counts = Counters(clock=lambda: 100.0)
    counts.record("/status", status=200, bytes_in=80, bytes_out=1000, applied=True)
    counts.record("/status", status=429, bytes_in=80, bytes_out=300, faulted=True, throttled=True)
    counts.record("/running", status=200, bytes_in=120, bytes_out=150, applied=True)
    counts.report_applied("/running", "u1")
    counts.report_applied("/register", "u1")  # not a report: ignored
    snap = counts.snapshot(reports=True)
    assert snap["totals"] == {
        "requests": 3,
        "bytes_in": 280,
        "bytes_out": 1450,
        "faulted": 1,
        "throttled": 1,
        "applied": 2,
    }
    assert snap["endpoints"]["/status"]["statuses"] == {"200": 1, "429": 1}
    assert snap["reports"]["/running"] == {"u1": 1}
    assert counts.endpoint("/nothing").requests == 0
    assert counts.reports("/running") == {"u1": 1}
