"""Fault switches of the simulated manager (5xx share, latency, refused connections) and its
request journal: what a client's outbox is tested against."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from managerhelpers import ManagerFactory, ManagerProcess, poll_until
from pacehelpers import patient

OUTAGE = {"error": "simulated outage"}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


def fault_pattern(mgr: ManagerProcess, count: int) -> list[int]:
    """Register ``count`` distinct labels; the status of each answer."""
    return [
        mgr.post("/register", json={"label": f"C.{n}", "min_rate": 0}).status_code
        for n in range(count)
    ]


# --- 5xx share -------------------------------------------------------------------------------
def test_fail_rate_share_and_no_state_change_on_faulted_requests(start: ManagerFactory) -> None:
    mgr = start("--fail-rate", "0.3", "--seed", "7")
    statuses = fault_pattern(mgr, 200)
    assert set(statuses) == {200, 503}
    failed = statuses.count(503)
    assert 40 <= failed <= 80, failed  # 30 % of 200, give or take

    # a faulted register created nothing: exactly the answered labels exist
    answered = {f"C.{n}" for n, status in enumerate(statuses) if status == 200}
    assert {inst["label"] for inst in mgr.instances()} == answered
    # ... and took no runner id
    assert mgr.state()["runner_id_counter"] == len(answered)

    journal = mgr.requests(path="/register")
    assert [e["status"] for e in journal] == statuses
    assert [e["faulted"] for e in journal] == [s == 503 for s in statuses]
    assert [e["json"]["label"] for e in journal] == [f"C.{n}" for n in range(200)]


def test_faulted_answer_is_503_json(start: ManagerFactory) -> None:
    mgr = start("--fail-next", "1")
    r = mgr.post("/register", json={"label": "C.1"})
    assert (r.status_code, r.json()) == (503, OUTAGE)
    assert r.headers["content-type"] == "application/json"


def test_the_same_seed_fails_the_same_requests(start: ManagerFactory, tmp_path: Path) -> None:
    first = fault_pattern(start("--fail-rate", "0.3", "--seed", "11", db=tmp_path / "a.db"), 60)
    second = fault_pattern(start("--fail-rate", "0.3", "--seed", "11", db=tmp_path / "b.db"), 60)
    other = fault_pattern(start("--fail-rate", "0.3", "--seed", "12", db=tmp_path / "c.db"), 60)
    assert first == second
    assert first != other


def test_random_seed_is_shown_so_a_run_can_be_repeated(start: ManagerFactory) -> None:
    seed = start("--fail-rate", "0.5").faults()["seed"]
    assert isinstance(seed, int)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/param-done", {}),
        ("/bench-done", {"rate": 10}),  # would fail the bench and kill
        ("/running", {}),
    ],
)
def test_faulted_report_changes_nothing(start: ManagerFactory, path: str, body: dict) -> None:
    mgr = start()
    reg = mgr.register("C.1")
    before = mgr.instance(reg["uuid"])
    mgr.faults(fail_next=1)
    r = mgr.post(path, json={"uuid": reg["uuid"], **body})
    assert (r.status_code, r.json()) == (503, OUTAGE)
    assert mgr.instance(reg["uuid"]) == before
    assert mgr.state()["kills"] == []
    assert mgr.post(path, json={"uuid": reg["uuid"], **body}).status_code == 200
    assert mgr.instance(reg["uuid"]) != before


def test_faulted_log_push_stores_nothing(start: ManagerFactory) -> None:
    mgr = start("--fail-next", "1")
    headers = {"X-Instance-UUID": "u-1", "X-Log-Source": "cuzk"}
    assert mgr.post("/api/log-push", content=b"lost", headers=headers).status_code == 503
    assert mgr.post("/api/log-push", content=b"kept", headers=headers).status_code == 204
    assert [line["text"] for line in mgr.get("/api/instance-logs/u-1").json()] == ["kept"]
    pushes = mgr.requests(path="/api/log-push")
    assert [(e["faulted"], e["lines_stored"], e["log_source"]) for e in pushes] == [
        (True, None, "cuzk"),
        (False, 1, "cuzk"),
    ]


def test_faults_limited_to_paths(start: ManagerFactory) -> None:
    mgr = start("--fail-rate", "1", "--fault-path", "/api")
    reg = mgr.register("C.1")  # /register is not faulted
    assert mgr.post("/param-done", json={"uuid": reg["uuid"]}).status_code == 200
    r = mgr.post("/api/log-push", content=b"x", headers={"X-Instance-UUID": reg["uuid"]})
    assert r.status_code == 503
    assert mgr.get(f"/api/instance-logs/{reg['uuid']}").status_code == 503


def test_sim_endpoints_are_never_faulted(start: ManagerFactory) -> None:
    mgr = start("--fail-rate", "1", "--latency", "30")
    assert mgr.get("/sim/state").status_code == 200
    assert mgr.faults()["fail_rate"] == 1


def test_faults_switched_at_run_time(start: ManagerFactory) -> None:
    mgr = start()
    assert mgr.faults(fail_rate=1, fail_status=500)["fail_rate"] == 1
    assert mgr.post("/register", json={"label": "C.1"}).status_code == 500
    mgr.faults(fail_rate=0)
    assert mgr.post("/register", json={"label": "C.1"}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [{"fail_rate": 1.5}, {"fail_rate": "x"}, {"nonsense": 1}, {"latency": -1}, [1]],
)
def test_bad_fault_settings_are_400(start: ManagerFactory, body: object) -> None:
    mgr = start()
    before = mgr.faults()
    r = mgr.post("/sim/faults", json=body)
    assert r.status_code == 400
    assert "error" in r.json()
    assert mgr.faults() == before


@pytest.mark.parametrize("text", ["fail_next=2,seed=3", '{"fail_next": 2, "seed": 3}'])
def test_faults_from_the_environment(start: ManagerFactory, text: str) -> None:
    mgr = start(env={"CUZK_SIM_MANAGER_FAULTS": text})
    assert mgr.faults()["seed"] == 3
    assert fault_pattern(mgr, 3) == [503, 503, 200]


def test_flags_win_over_the_environment(start: ManagerFactory) -> None:
    mgr = start("--seed", "5", env={"CUZK_SIM_MANAGER_FAULTS": "seed=3,latency=0.25"})
    faults = mgr.faults()
    assert (faults["seed"], faults["latency"]) == (5, 0.25)


# --- latency ---------------------------------------------------------------------------------
def test_latency_is_added_to_each_request(start: ManagerFactory) -> None:
    mgr = start("--latency", "0.3")
    began = time.monotonic()
    assert mgr.get("/status").status_code == 200
    # Lower bounds, not margins: the latency was added (a slow machine only adds more).
    assert time.monotonic() - began >= 0.3
    assert mgr.requests(path="/status")[-1]["duration"] >= 0.3


def test_late_answer_after_the_state_changed(start: ManagerFactory) -> None:
    """Latency "after" (the default): applied at once, answered late. A client that gives up
    has still registered: its retry must get the same instance back."""
    mgr = start("--latency", "0.6", "--fault-path", "/register")
    with mgr.client(timeout=0.1) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/register", json={"label": "C.1"})
    poll_until(lambda: [i["label"] for i in mgr.status()] == ["C.1"], 10, what="the register")


def test_latency_before_delays_the_change_too(start: ManagerFactory) -> None:
    mgr = start("--latency", "0.8", "--latency-phase", "before", "--fault-path", "/register")
    with mgr.client(timeout=0.1) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/register", json={"label": "C.1"})
    assert mgr.status() == []  # not applied yet
    poll_until(lambda: len(mgr.status()) == 1, 10, what="the late register")
    poll_until(
        lambda: [e["status"] for e in mgr.requests(path="/register")] == [200],
        10,
        what="the late answer in the journal",
    )


# --- refused connections ---------------------------------------------------------------------
# The refusing windows are long enough that the requests meant for them land inside, however
# slow the machine (a window of 0.5 s had passed before the first request on a slow one).
def refuse_s() -> float:
    return patient(3.0)


def test_refuse_for_from_start_refuses_then_serves(start: ManagerFactory) -> None:
    mgr = start("--refuse-for", f"{refuse_s():g}", ready=False)
    assert "refusing connections" in mgr.lines[0]
    with pytest.raises(httpx.ConnectError):
        httpx.get(mgr.url + "/status", timeout=2)
    mgr.wait_ready(10)
    assert mgr.get("/status").status_code == 200
    # nothing from the refused window was received, only what came after
    assert [e["path"] for e in mgr.requests()] == ["/status"]


def test_refuse_at_run_time_closes_open_connections_too(start: ManagerFactory) -> None:
    mgr = start()
    with mgr.client() as pooled:
        assert pooled.get("/status").status_code == 200  # a keep-alive connection is open
        view = mgr.faults(refuse_for=refuse_s())
        assert view["refusing"] is True
        with pytest.raises(httpx.ConnectError):
            httpx.get(mgr.url + "/status", timeout=2)
        with pytest.raises(httpx.TransportError):  # the pooled connection is not answered
            pooled.post("/register", json={"label": "C.lost"})
        poll_until(lambda: pooled.get("/status").status_code == 200, 10, what="serving again")
    assert [i["label"] for i in mgr.status()] == []
    mgr.wait_for_line("accepting connections again", 5)
    assert mgr.faults()["refusing"] is False


# --- the journal -----------------------------------------------------------------------------
def test_journal_records_every_request_in_order(start: ManagerFactory) -> None:
    mgr = start()
    reg = mgr.register("C.1")
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    mgr.post(
        "/api/log-push",
        content=b"a\nb\n",
        headers={"X-Instance-UUID": reg["uuid"], "X-Log-Source": "setup"},
    )
    mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 70})
    mgr.get("/register")  # 405
    mgr.post("/running", json={"uuid": reg["uuid"]})
    journal = mgr.requests()
    assert [(e["method"], e["path"], e["status"]) for e in journal] == [
        ("POST", "/register", 200),
        ("POST", "/param-done", 200),
        ("POST", "/api/log-push", 204),
        ("POST", "/bench-done", 200),
        ("GET", "/register", 405),
        ("POST", "/running", 200),
    ]
    seqs = [e["seq"] for e in journal]
    assert seqs == sorted(seqs)
    assert all(not e["faulted"] and not e["sim"] and e["answered"] for e in journal)
    assert journal[2]["log_source"] == "setup"
    assert journal[2]["body_bytes"] == 4
    assert journal[3]["json"] == {"uuid": reg["uuid"], "rate": 70}
    assert all(isinstance(e["ts"], float) for e in journal)
    # filters: since, path, and the /sim/ requests themselves on demand
    assert mgr.requests(since=seqs[3]) == journal[4:]
    assert [e["path"] for e in mgr.requests(path="/bench-done")] == ["/bench-done"]
    assert any(e["path"] == "/sim/requests" for e in mgr.requests(include_sim=True))
