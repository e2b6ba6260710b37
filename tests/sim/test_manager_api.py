"""The simulated manager's HTTP API against ``docs/manager-api.md``, over real HTTP to a
real process. One process serves the module; each test uses its own labels."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from managerhelpers import ManagerProcess

STATUS_FIELDS = {"uuid", "label", "runner_id", "state", "min_rate", "registered_at"}
OPTIONAL_FIELDS = {
    "param_done_at",
    "bench_done_at",
    "bench_rate",
    "killed_at",
    "kill_reason",
}


@pytest.fixture(scope="module")
def mgr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    db: Path = tmp_path_factory.mktemp("manager") / "manager.db"
    with ManagerProcess.start(db) as process:
        yield process


def label() -> str:
    """A fresh label of the platform's form, ``C.<instance id>``."""
    return f"C.{uuidlib.uuid4().int % 10**12}"


def instance(mgr: ManagerProcess, uuid: str) -> dict:
    found = mgr.instance(uuid)
    assert found is not None, f"{uuid} not in /status"
    return found


# --- /register -------------------------------------------------------------------------------
def test_register_returns_uuid_and_runner_id(mgr: ManagerProcess) -> None:
    name = label()
    r = mgr.post("/register", json={"label": name, "min_rate": 40})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"uuid", "runner_id"}
    assert uuidlib.UUID(body["uuid"])
    assert isinstance(body["runner_id"], int)
    inst = instance(mgr, body["uuid"])
    assert inst["label"] == name
    assert inst["state"] == "registered"
    assert inst["min_rate"] == 40


def test_register_is_idempotent_per_label_and_keeps_min_rate(mgr: ManagerProcess) -> None:
    name = label()
    first = mgr.register(name, min_rate=33)
    again = mgr.register(name, min_rate=99)
    assert again == first
    assert instance(mgr, first["uuid"])["min_rate"] == 33
    assert sum(1 for i in mgr.status() if i["label"] == name) == 1


def test_register_idempotent_in_any_live_state(mgr: ManagerProcess) -> None:
    name = label()
    first = mgr.register(name)
    mgr.post("/param-done", json={"uuid": first["uuid"]})
    mgr.post("/bench-done", json={"uuid": first["uuid"], "rate": 80})
    mgr.post("/running", json={"uuid": first["uuid"]})
    assert mgr.register(name) == first


def test_each_new_label_takes_the_next_runner_id(mgr: ManagerProcess) -> None:
    ids = [mgr.register(label())["runner_id"] for _ in range(3)]
    assert ids == [ids[0], ids[0] + 1, ids[0] + 2]


def test_register_after_kill_gives_new_uuid_and_runner_id(mgr: ManagerProcess) -> None:
    name = label()
    first = mgr.register(name)
    mgr.kill_instance(first["uuid"], "operator says so")
    second = mgr.register(name)
    assert second["uuid"] != first["uuid"]
    assert second["runner_id"] > first["runner_id"]
    assert instance(mgr, first["uuid"])["state"] == "killed"
    assert instance(mgr, second["uuid"])["state"] == "registered"
    assert mgr.register(name) == second


@pytest.mark.parametrize("body", [{"min_rate": 0}, {"min_rate": -5}, {}, {"min_rate": None}])
def test_min_rate_zero_negative_or_missing_means_50(mgr: ManagerProcess, body: dict) -> None:
    reg = mgr.post("/register", json={"label": label(), **body}).json()
    assert instance(mgr, reg["uuid"])["min_rate"] == 50


def test_register_field_names_match_case_insensitively_like_go(mgr: ManagerProcess) -> None:
    name = label()
    reg = mgr.post("/register", json={"Label": name, "MIN_RATE": 12}).json()
    inst = instance(mgr, reg["uuid"])
    assert (inst["label"], inst["min_rate"]) == (name, 12)


@pytest.mark.parametrize(
    "raw", [b'{"label": ""}', b'{"min_rate": 10}', b'{"label": null}', b"null", b"{}"]
)
def test_register_without_label_is_400(mgr: ManagerProcess, raw: bytes) -> None:
    r = mgr.post("/register", content=raw)
    assert r.status_code == 400
    assert r.json() == {"error": "label is required"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"not json",
        b"[]",
        b'"C.1"',
        b'{"label": 5}',
        b'{"label": "C.x", "min_rate": "fast"}',
        b'{"label": "C.x", "min_rate": true}',
        b'{"label": "C.x", "min_rate": NaN}',
        b'{"label": "C.x", "min_rate": 1e999}',
        b'{"label": "C.x", "min_rate": 1' + b"0" * 400 + b"}",
    ],
)
def test_register_bad_json_is_400(mgr: ManagerProcess, raw: bytes) -> None:
    before = len(mgr.status())
    r = mgr.post("/register", content=raw)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"].startswith("bad request: ")
    assert len(mgr.status()) == before


# --- /param-done -----------------------------------------------------------------------------
def test_param_done_moves_registered_to_params_done(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    r = mgr.post("/param-done", json={"uuid": reg["uuid"]})
    assert (r.status_code, r.json()) == (200, {"ok": True})
    inst = instance(mgr, reg["uuid"])
    assert inst["state"] == "params_done"
    assert "param_done_at" in inst


def test_param_done_in_other_states_is_a_noop_that_says_ok(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    stamp = instance(mgr, reg["uuid"])["param_done_at"]
    r = mgr.post("/param-done", json={"uuid": reg["uuid"]})
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert instance(mgr, reg["uuid"])["param_done_at"] == stamp

    mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 99})
    assert mgr.post("/param-done", json={"uuid": reg["uuid"]}).json() == {"ok": True}
    assert instance(mgr, reg["uuid"])["state"] == "bench_done"

    mgr.kill_instance(reg["uuid"])
    assert mgr.post("/param-done", json={"uuid": reg["uuid"]}).json() == {"ok": True}
    assert instance(mgr, reg["uuid"])["state"] == "killed"


@pytest.mark.parametrize("body", [{"uuid": "no-such-uuid"}, {}, {"uuid": ""}])
def test_param_done_unknown_uuid_is_404(mgr: ManagerProcess, body: dict) -> None:
    r = mgr.post("/param-done", json=body)
    assert (r.status_code, r.json()) == (404, {"error": "instance not found"})


def test_param_done_bad_json_is_400(mgr: ManagerProcess) -> None:
    assert mgr.post("/param-done", content=b"{uuid}").status_code == 400


# --- /bench-done -----------------------------------------------------------------------------
def test_bench_done_pass_records_rate(mgr: ManagerProcess) -> None:
    reg = mgr.register(label(), min_rate=40)
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 41.5})
    assert (r.status_code, r.json()) == (200, {"ok": True, "passed": True})
    inst = instance(mgr, reg["uuid"])
    assert inst["state"] == "bench_done"
    assert inst["bench_rate"] == 41.5
    assert "bench_done_at" in inst
    assert "killed_at" not in inst


def test_bench_done_rate_equal_to_min_rate_passes(mgr: ManagerProcess) -> None:
    reg = mgr.register(label(), min_rate=40)
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 40}).json()["passed"]


def test_bench_done_fail_kills_and_destroys_at_once(mgr: ManagerProcess) -> None:
    name = label()
    reg = mgr.register(name, min_rate=50)
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 35.9})
    assert (r.status_code, r.json()) == (200, {"ok": True, "passed": False})
    inst = instance(mgr, reg["uuid"])
    assert inst["state"] == "killed"
    assert inst["kill_reason"] == "bench_rate 35.9 below min_rate 50.0"
    assert "killed_at" in inst
    # the failed bench is kept on the killed record
    assert inst["bench_rate"] == 35.9
    assert inst["bench_done_at"] == inst["killed_at"]
    kills = [k for k in mgr.state()["kills"] if k["uuid"] == reg["uuid"]]
    assert len(kills) == 1
    assert kills[0]["destroyed"] is True
    # the label is free again: a new instance, not the killed one
    assert mgr.register(name)["uuid"] != reg["uuid"]


def test_bench_done_does_not_check_the_current_state(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())  # straight from registered, no param-done
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 60}).json()["passed"]
    assert instance(mgr, reg["uuid"])["state"] == "bench_done"

    mgr.kill_instance(reg["uuid"])  # not even killed is checked: a pass revives it
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 70}).json()["passed"]
    assert instance(mgr, reg["uuid"])["state"] == "bench_done"


def test_bench_done_missing_rate_is_zero_and_fails(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"]}).json() == {
        "ok": True,
        "passed": False,
    }


def test_bench_done_unknown_uuid_is_404(mgr: ManagerProcess) -> None:
    r = mgr.post("/bench-done", json={"uuid": "nope", "rate": 100})
    assert (r.status_code, r.json()) == (404, {"error": "instance not found"})


def test_bench_done_bad_json_is_400(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": "fast"})
    assert r.status_code == 400
    assert r.json() == {
        "error": "bad request: json: cannot unmarshal string into Go struct field "
        "BenchDoneReq.rate of type float64"
    }
    assert instance(mgr, reg["uuid"])["state"] == "registered"


# --- /running --------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [[], ["/param-done"], ["/param-done", "/bench-done"]])
def test_running_from_any_state_but_killed(mgr: ManagerProcess, steps: list[str]) -> None:
    reg = mgr.register(label())
    for step in steps:
        mgr.post(step, json={"uuid": reg["uuid"], "rate": 99})
    r = mgr.post("/running", json={"uuid": reg["uuid"]})
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert instance(mgr, reg["uuid"])["state"] == "running"
    assert mgr.post("/running", json={"uuid": reg["uuid"]}).json() == {"ok": True}


def test_running_after_kill_is_404(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 1})  # fails: killed
    r = mgr.post("/running", json={"uuid": reg["uuid"]})
    assert (r.status_code, r.json()) == (404, {"error": "instance not found or already killed"})
    assert instance(mgr, reg["uuid"])["state"] == "killed"


def test_running_unknown_is_404(mgr: ManagerProcess) -> None:
    r = mgr.post("/running", json={"uuid": "nope"})
    assert (r.status_code, r.json()) == (404, {"error": "instance not found or already killed"})


# --- /runner-id, /status ---------------------------------------------------------------------
def test_runner_id(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    r = mgr.get("/runner-id", params={"uuid": reg["uuid"]})
    assert (r.status_code, r.json()) == (200, {"runner_id": reg["runner_id"]})
    mgr.kill_instance(reg["uuid"])
    assert mgr.get("/runner-id", params={"uuid": reg["uuid"]}).json() == {
        "runner_id": reg["runner_id"]
    }


def test_runner_id_without_uuid_is_400_and_unknown_is_404(mgr: ManagerProcess) -> None:
    r = mgr.get("/runner-id")
    assert (r.status_code, r.json()) == (400, {"error": "uuid query param required"})
    assert mgr.get("/runner-id", params={"uuid": ""}).status_code == 400
    r = mgr.get("/runner-id", params={"uuid": "nope"})
    assert (r.status_code, r.json()) == (404, {"error": "instance not found"})


def test_status_omits_unset_optional_fields(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    inst = instance(mgr, reg["uuid"])
    assert set(inst) == STATUS_FIELDS


def test_status_lists_every_field_once_set(mgr: ManagerProcess) -> None:
    reg = mgr.register(label(), min_rate=20)
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 25})
    mgr.kill_instance(reg["uuid"], "instance gone")
    inst = instance(mgr, reg["uuid"])
    assert set(inst) == STATUS_FIELDS | OPTIONAL_FIELDS
    assert inst["kill_reason"] == "instance gone"
    times = [
        datetime.strptime(inst[k], "%Y-%m-%d %H:%M:%S")  # whole seconds, UTC, no zone
        for k in ("registered_at", "param_done_at", "bench_done_at", "killed_at")
    ]
    assert times == sorted(times)


def test_status_is_by_runner_id_highest_first(mgr: ManagerProcess) -> None:
    uuids = [mgr.register(label())["uuid"] for _ in range(3)]
    listed = [i["uuid"] for i in mgr.status() if i["uuid"] in uuids]
    assert listed == uuids[::-1]
    ids = [i["runner_id"] for i in mgr.status()]
    assert ids == sorted(ids, reverse=True)


# --- /bad-host, errors -----------------------------------------------------------------------
def test_bad_host(mgr: ManagerProcess) -> None:
    r = mgr.post("/bad-host", json={"machine_id": "m-4242", "reason": "GPU fell off the bus"})
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert {"machine_id": "m-4242", "reason": "GPU fell off the bus"}.items() <= (
        mgr.state()["bad_hosts"][-1].items()
    )
    assert mgr.post("/bad-host", content=b"{").status_code == 400


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/register"),
        ("PUT", "/param-done"),
        ("GET", "/bench-done"),
        ("DELETE", "/running"),
        ("POST", "/runner-id"),
        ("POST", "/status"),
        ("GET", "/api/log-push"),
        ("POST", "/api/instance-logs/some-uuid"),
        ("PUT", "/bad-host"),
        ("GET", "/api/kill"),
        ("HEAD", "/api/kill"),
        ("GET", "/bad-host/m-1"),
    ],
)
def test_wrong_method_is_plain_text_405(mgr: ManagerProcess, method: str, path: str) -> None:
    r = mgr.http.request(method, path)
    assert r.status_code == 405
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert "allow" not in r.headers
    if method != "HEAD":
        assert r.text == "method not allowed\n"


def test_unknown_path_is_plain_text_404(mgr: ManagerProcess) -> None:
    r = mgr.get("/no/such/thing")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("path", ["/status", "/runner-id", "/api/instance-logs/u-1"])
def test_head_is_a_wrong_method_even_on_a_get_route(mgr: ManagerProcess, path: str) -> None:
    r = mgr.http.head(path)
    assert r.status_code == 405
    assert "allow" not in r.headers
    assert r.content == b""


# --- /sim/kill -------------------------------------------------------------------------------
def test_sim_kill(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    r = mgr.post("/sim/kill", json={"uuid": reg["uuid"], "reason": "bad host"})
    assert r.status_code == 200
    inst = instance(mgr, reg["uuid"])
    assert (inst["state"], inst["kill_reason"]) == ("killed", "bad host")
    assert mgr.post("/sim/kill", json={"uuid": "nope"}).status_code == 404
