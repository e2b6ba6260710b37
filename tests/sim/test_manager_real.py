"""The simulated manager against what the real (Go) manager was seen to do
(``docs/manager-api.md``, "More of the real manager's behaviour"), each point over real
HTTP to a real process: the dashboard's kill, the failed bench's record, the monitor's sweep
(timeouts, the platform's instance list, bad hosts), the instance-log buffer, ``/status``'s
order and formats, the manager's own log, and the real status codes and texts."""

from __future__ import annotations

import json
import re
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from managerhelpers import ManagerFactory, ManagerProcess, poll_until

STATUS_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
GO_LOG_PREFIX = r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d "


@pytest.fixture(scope="module")
def mgr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    db: Path = tmp_path_factory.mktemp("manager") / "manager.db"
    with ManagerProcess.start(db) as process:
        yield process


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


def label() -> str:
    return f"C.{uuidlib.uuid4().int % 10**12}"


def record(mgr: ManagerProcess, uuid: str) -> dict[str, Any]:
    found = mgr.instance(uuid)
    assert found is not None, f"{uuid} not in /status"
    return found


def is_killed(mgr: ManagerProcess, uuid: str) -> Callable[[], bool]:
    """A check for ``poll_until``: the record of ``uuid`` is in state ``killed``."""
    return lambda: record(mgr, uuid)["state"] == "killed"


def kills_of(mgr: ManagerProcess, uuid: str) -> list[dict[str, Any]]:
    return [k for k in mgr.state()["kills"] if k["uuid"] == uuid]


def write_platform(path: Path, instances: list[Any]) -> None:
    """Replace the platform list atomically (the manager reads it at every sweep)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(instances))
    tmp.replace(path)


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


# --- the dashboard's kill --------------------------------------------------------------------
def test_api_kill_marks_the_record_killed_manually_via_ui(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    r = mgr.api_kill(reg["uuid"])
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert r.text == '{"ok":true}\n'
    inst = record(mgr, reg["uuid"])
    assert (inst["state"], inst["kill_reason"]) == ("killed", "manually killed via UI")
    assert "killed_at" in inst
    # without a vast_id nothing is destroyed: the container lives on, told nothing
    assert [k["destroyed"] for k in kills_of(mgr, reg["uuid"])] == [False]


def test_api_kill_with_a_vast_id_destroys_the_container(
    start: ManagerFactory, tmp_path: Path
) -> None:
    marker = tmp_path / "destroyed"
    mgr = start("--destroy-command", f'printf "%s" "$CUZK_SIM_VAST_ID" > {marker}')
    reg = mgr.register("C.5150")
    assert mgr.api_kill(reg["uuid"], vast_id=5150).json() == {"ok": True}
    assert record(mgr, reg["uuid"])["kill_reason"] == "manually killed via UI"
    (event,) = kills_of(mgr, reg["uuid"])
    assert (event["destroyed"], event["vast_id"], event["cause"]) == (True, 5150, "manual")
    assert poll_until(lambda: marker.exists() and marker.read_text(), 10) == "5150"
    assert any("[kill] manually destroying vast instance 5150" in t for t in mgr.manager_log())


def test_api_kill_leaves_an_already_killed_record_as_it_was(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    mgr.kill_instance(reg["uuid"], "param fetch timeout (90min)")
    before = record(mgr, reg["uuid"])
    assert mgr.api_kill(reg["uuid"]).json() == {"ok": True}
    assert record(mgr, reg["uuid"]) == before


@pytest.mark.parametrize("body", [{"uuid": "no-such-uuid"}, {}, {"vast_id": 0}, None])
def test_api_kill_of_nothing_known_still_says_ok(mgr: ManagerProcess, body: Any) -> None:
    before = mgr.status()
    r = mgr.post("/api/kill", content=b"null" if body is None else json.dumps(body).encode())
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert mgr.status() == before


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b"", "EOF"),
        (b"{", "unexpected EOF"),
        (b'{"vast_id": 1.5}', "json: cannot unmarshal number 1.5 into Go struct field "
         ".vast_id of type int"),
        (b'{"uuid": 7}', "json: cannot unmarshal number into Go struct field .uuid of type "
         "string"),
    ],
)  # fmt: skip
def test_api_kill_bad_json_is_400(mgr: ManagerProcess, raw: bytes, detail: str) -> None:
    r = mgr.post("/api/kill", content=raw)
    assert (r.status_code, r.json()) == (400, {"error": f"bad request: {detail}"})


def test_a_killed_record_is_revived_by_reports_with_its_kill_fields_kept(
    mgr: ManagerProcess,
) -> None:
    """The real manager does not check the state: an instance that reports after a kill
    moves its record back. The supervisor must find out from /status itself."""
    reg = mgr.register(label(), min_rate=30)
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    mgr.api_kill(reg["uuid"])
    killed = record(mgr, reg["uuid"])
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 40}).json()["passed"]
    revived = record(mgr, reg["uuid"])
    assert revived["state"] == "bench_done"
    assert (revived["killed_at"], revived["kill_reason"]) == (
        killed["killed_at"],
        "manually killed via UI",
    )
    assert mgr.post("/running", json={"uuid": reg["uuid"]}).json() == {"ok": True}
    running = record(mgr, reg["uuid"])
    assert (running["state"], running["kill_reason"]) == ("running", "manually killed via UI")


# --- a failed bench ---------------------------------------------------------------------------
def test_a_failed_bench_keeps_its_time_and_rate_with_the_real_reason(
    mgr: ManagerProcess,
) -> None:
    reg = mgr.register(label(), min_rate=30)
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 12.34})
    assert r.json() == {"ok": True, "passed": False}
    inst = record(mgr, reg["uuid"])
    assert inst["state"] == "killed"
    assert inst["kill_reason"] == "bench_rate 12.3 below min_rate 30.0"
    assert inst["bench_rate"] == 12.34
    assert STATUS_TIME.match(inst["bench_done_at"])
    assert inst["bench_done_at"] == inst["killed_at"]
    # a C.<digits> label names the platform's instance: destroyed at once
    (event,) = kills_of(mgr, reg["uuid"])
    assert (event["destroyed"], event["vast_id"]) == (True, int(inst["label"][2:]))


def test_a_failed_bench_of_another_label_form_is_not_destroyed(mgr: ManagerProcess) -> None:
    reg = mgr.register(f"box-{uuidlib.uuid4().hex[:8]}", min_rate=30)
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 1}).json()["passed"] is False
    assert [(k["destroyed"], k["vast_id"]) for k in kills_of(mgr, reg["uuid"])] == [(False, None)]


# --- the sweep: timeouts ---------------------------------------------------------------------
def test_time_scale_divides_the_sweep_durations(start: ManagerFactory) -> None:
    mgr = start("--time-scale", "3600")
    assert mgr.state()["timeouts"] == {
        "param": 1.5,
        "bench": 0.75,
        "check_interval": 60 / 3600,
        "first_check": 10 / 3600,
        "time_scale": 3600,
    }
    stuck = mgr.register("C.11")
    benching = mgr.register("C.12")
    mgr.post("/param-done", json={"uuid": benching["uuid"]})
    passed = mgr.register("C.13")
    mgr.post("/bench-done", json={"uuid": passed["uuid"], "rate": 60})
    poll_until(lambda: record(mgr, stuck["uuid"])["state"] == "killed", 15, what="param timeout")
    poll_until(lambda: record(mgr, benching["uuid"])["state"] == "killed", 15, what="bench")
    assert record(mgr, stuck["uuid"])["kill_reason"] == "param fetch timeout (90min)"
    assert record(mgr, benching["uuid"])["kill_reason"] == "benchmark timeout (45min)"
    assert record(mgr, passed["uuid"])["state"] == "bench_done"  # no timeout after bench_done
    # not before its (scaled) time: killed at least 1.5 s / 0.75 s after the clock started
    # (lower bounds, not margins: a slow machine only kills later)
    journal = {e["json"]["label"]: e["ts"] for e in mgr.requests(path="/register")}
    param_done = next(e["ts"] for e in mgr.requests(path="/param-done"))
    (stuck_kill,) = kills_of(mgr, stuck["uuid"])
    (bench_kill,) = kills_of(mgr, benching["uuid"])
    assert epoch(stuck_kill["ts"]) - journal["C.11"] >= 1.5
    assert epoch(bench_kill["ts"]) - param_done >= 0.75
    # both timeouts destroy the container (C.<digits>: the platform's instance)
    assert stuck_kill["destroyed"]
    assert bench_kill["destroyed"]


def test_the_benchmark_clock_starts_when_param_done_arrives(start: ManagerFactory) -> None:
    """The 45-minute clock counts from param_done_at, stamped on arrival: a late
    /param-done starts it late, whatever the instance's own clock says."""
    mgr = start("--param-timeout", "1h", "--bench-timeout", "1.0", "--time-scale", "1",
                "--first-check", "0.05", "--check-interval", "0.05")  # fmt: skip
    reg = mgr.register("C.21")
    registered = mgr.requests(path="/register")[-1]["ts"]
    # the instance finished its params long ago (by its clock); the report arrives now
    poll_until(lambda: time.time() - registered > 1.2, 5, what="more than the bench budget")
    mgr.post("/param-done", json={"uuid": reg["uuid"]})
    arrived = mgr.requests(path="/param-done")[-1]["ts"]
    poll_until(lambda: record(mgr, reg["uuid"])["state"] == "killed", 10, what="bench timeout")
    (event,) = kills_of(mgr, reg["uuid"])
    assert epoch(event["ts"]) - arrived >= 1.0  # a lower bound: never before the budget


def monitor_lines(mgr: ManagerProcess) -> list[dict[str, Any]]:
    lines = mgr.get("/sim/manager-log").json()
    return [line for line in lines if "[monitor] cached" in line["text"]]


def test_first_sweep_at_ten_seconds_then_every_sixty_scaled(
    start: ManagerFactory, tmp_path: Path
) -> None:
    platform = tmp_path / "instances.json"
    write_platform(platform, [])
    mgr = start("--instances", str(platform), "--time-scale", "20")  # +0.5 s, then every 3 s
    started = next(
        line["ts"]
        for line in mgr.get("/sim/manager-log").json()
        if "API server listening on" in line["text"]
    )
    poll_until(lambda: len(monitor_lines(mgr)) >= 2, 20, what="two sweeps")
    first, second = (line["ts"] for line in monitor_lines(mgr)[:2])
    assert 500 <= first - started < 3000, (started, first)
    assert second - first >= 3000 - 10, (first, second)  # ms stamps: a few ms of truncation
    assert mgr.state()["sweeps"]["count"] >= 2


# --- the sweep: the platform's instance list -------------------------------------------------
def test_records_the_platform_list_does_not_name_are_killed(
    start: ManagerFactory, tmp_path: Path
) -> None:
    platform = tmp_path / "instances.json"
    write_platform(
        platform,
        [
            {"id": 101, "label": "C.101", "machine_id": 1, "actual_status": "running"},
            {"id": 202, "label": None},  # the platform's own label is often empty
            {"id": 303, "label": "box-3"},
            404404,  # a bare id is an instance with no label
        ],
    )
    mgr = start("--instances", str(platform), "--first-check", "0.1", "--check-interval", "0.1")
    live = {name: mgr.register(name) for name in ("C.101", "C.202", "box-3", "C.404404")}
    gone = {name: mgr.register(name) for name in ("C.505", "my-box", "C.202x")}
    for name, reg in gone.items():
        poll_until(is_killed(mgr, reg["uuid"]), 10, what=name)
        inst = record(mgr, reg["uuid"])
        assert inst["kill_reason"] == "instance disappeared from vast"
        assert [k["destroyed"] for k in kills_of(mgr, reg["uuid"])] == [False]
    count = mgr.state()["sweeps"]["count"]
    poll_until(lambda: mgr.state()["sweeps"]["count"] >= count + 2, 10, what="later sweeps")
    for name, reg in live.items():
        assert record(mgr, reg["uuid"])["state"] == "registered", name
    assert any("[monitor] instance disappeared from vast" in t for t in mgr.manager_log())

    # the instance goes away on the platform: its record follows at the next sweep
    write_platform(platform, [{"id": 101, "label": "C.101"}, {"id": 303, "label": "box-3"}])
    for name in ("C.202", "C.404404"):
        poll_until(is_killed(mgr, live[name]["uuid"]), 10, what=name)
    assert record(mgr, live["C.101"]["uuid"])["state"] == "registered"
    assert mgr.state()["platform"] == [
        {"id": 101, "label": "C.101", "machine_id": None},
        {"id": 303, "label": "box-3", "machine_id": None},
    ]


def test_an_unreadable_platform_list_skips_the_whole_sweep(
    start: ManagerFactory, tmp_path: Path
) -> None:
    platform = tmp_path / "instances.json"  # missing: `vastai show instances` failing
    mgr = start("--instances", str(platform), "--param-timeout", "0",
                "--first-check", "0.05", "--check-interval", "0.05")  # fmt: skip
    reg = mgr.register("C.31")
    poll_until(lambda: mgr.state()["sweeps"]["count"] >= 3, 10, what="failed sweeps")
    assert record(mgr, reg["uuid"])["state"] == "registered"  # no timeout checked either
    assert "enumerate vast instances" in mgr.state()["sweeps"]["error"]
    platform.write_text("{not json")
    count = mgr.state()["sweeps"]["count"]
    poll_until(lambda: mgr.state()["sweeps"]["count"] >= count + 2, 10, what="more sweeps")
    assert record(mgr, reg["uuid"])["state"] == "registered"

    write_platform(platform, [{"id": 31, "label": ""}])
    poll_until(lambda: record(mgr, reg["uuid"])["state"] == "killed", 10, what="param timeout")
    assert record(mgr, reg["uuid"])["kill_reason"] == "param fetch timeout (90min)"
    assert [k["destroyed"] for k in kills_of(mgr, reg["uuid"])] == [True]  # found: destroyed


def test_an_instance_on_a_bad_host_is_killed_at_the_sweep(
    start: ManagerFactory, tmp_path: Path
) -> None:
    platform = tmp_path / "instances.json"
    write_platform(platform, [{"id": 77, "label": "", "machine_id": 9001}, {"id": 78}])
    mgr = start("--instances", str(platform), "--first-check", "0.05", "--check-interval", "0.05")
    doomed, spared = mgr.register("C.77"), mgr.register("C.78")
    mgr.post("/bad-host", json={"machine_id": "9001", "reason": "GPU fell off the bus"})
    poll_until(lambda: record(mgr, doomed["uuid"])["state"] == "killed", 10, what="bad host")
    assert record(mgr, doomed["uuid"])["kill_reason"] == "bad host 9001: GPU fell off the bus"
    assert [k["destroyed"] for k in kills_of(mgr, doomed["uuid"])] == [True]
    assert record(mgr, spared["uuid"])["state"] == "registered"


def test_sim_sweep_runs_one_sweep_now(start: ManagerFactory, tmp_path: Path) -> None:
    platform = tmp_path / "instances.json"
    write_platform(platform, [])
    mgr = start("--instances", str(platform), "--first-check", "1h")
    reg = mgr.register("C.41")
    assert mgr.state()["sweeps"]["count"] == 0
    result = mgr.sweep()
    assert [(k["uuid"], k["cause"]) for k in result["kills"]] == [(reg["uuid"], "disappeared")]
    assert result["sweeps"]["count"] == 1
    assert record(mgr, reg["uuid"])["kill_reason"] == "instance disappeared from vast"


# --- instance logs -----------------------------------------------------------------------------
def push(mgr: ManagerProcess, uuid: str, text: str, source: str | None = None) -> None:
    headers = {"X-Instance-UUID": uuid}
    if source is not None:
        headers["X-Log-Source"] = source
    assert mgr.post("/api/log-push", content=text.encode(), headers=headers).status_code == 204


def test_instance_logs_return_the_last_1000_lines_without_tail(mgr: ManagerProcess) -> None:
    uuid = mgr.register(label())["uuid"]
    push(mgr, uuid, "\n".join(f"line {n}" for n in range(1500)), source="cuzk")
    got = [line["text"] for line in mgr.logs(uuid)]
    assert got == [f"line {n}" for n in range(500, 1500)]
    for tail in ("0", "-5", "abc", ""):  # not a positive integer: the default
        assert len(mgr.logs(uuid, tail=tail)) == 1000, tail
    assert len(mgr.logs(uuid, tail=1200)) == 1200
    assert len(mgr.logs(uuid, tail="+3")) == 3  # Go's Atoi takes a sign


def test_source_all_means_every_source(mgr: ManagerProcess) -> None:
    uuid = mgr.register(label())["uuid"]
    for source in ("setup", "benchdaemon", "benchout", "cuzk", "curio", "supervisor"):
        push(mgr, uuid, f"from {source}", source=source)
    every = [line["src"] for line in mgr.logs(uuid)]
    assert every == ["setup", "benchdaemon", "benchout", "cuzk", "curio", "supervisor"]
    assert [line["src"] for line in mgr.logs(uuid, source="all")] == every
    assert [line["text"] for line in mgr.logs(uuid, source="benchout")] == ["from benchout"]


def test_log_times_are_integer_milliseconds_and_carriage_returns_stay(
    mgr: ManagerProcess,
) -> None:
    uuid = mgr.register(label())["uuid"]
    before = int(time.time() * 1000)
    push(mgr, uuid, "progress 10%\r\nprogress 20%\r\n")
    after = int(time.time() * 1000)
    r = mgr.get(f"/api/instance-logs/{uuid}")
    assert re.search(r'"ts":\d+\}', r.text)  # a JSON integer, not 1.7e12 nor a string
    lines = r.json()
    assert [line["text"] for line in lines] == ["progress 10%\r", "progress 20%\r"]
    assert all(isinstance(line["ts"], int) and before <= line["ts"] <= after for line in lines)


def test_instance_logs_path_rules(mgr: ManagerProcess) -> None:
    uuid = mgr.register(label())["uuid"]
    push(mgr, uuid, "hello")
    r = mgr.get("/api/instance-logs/")
    assert (r.status_code, r.json()) == (400, {"error": "uuid required in path"})
    extra = mgr.get(f"/api/instance-logs/{uuid}/more/segments")
    assert (extra.status_code, [line["text"] for line in extra.json()]) == (200, ["hello"])
    moved = mgr.get("/api/instance-logs", follow_redirects=False)
    assert (moved.status_code, moved.headers["location"]) == (301, "/api/instance-logs/")


# --- /status ---------------------------------------------------------------------------------
def test_status_numbers_and_times_as_go_prints_them(mgr: ManagerProcess) -> None:
    reg = mgr.register(label(), min_rate=30)
    mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 41.5})
    raw = mgr.get("/status").text
    entry = re.search(r'\{"uuid":"' + reg["uuid"] + r'"[^}]*\}', raw)
    assert entry is not None, raw[:500]
    assert '"min_rate":30,' in entry.group(0)
    assert '"bench_rate":41.5' in entry.group(0)
    assert "30.0" not in entry.group(0)
    inst = json.loads(entry.group(0))
    assert STATUS_TIME.match(inst["registered_at"])
    assert STATUS_TIME.match(inst["bench_done_at"])
    assert abs(datetime.strptime(inst["registered_at"] + "+0000", "%Y-%m-%d %H:%M:%S%z")
               .timestamp() - time.time()) < 60  # fmt: skip
    ids = [i["runner_id"] for i in json.loads(raw)]
    assert ids == sorted(ids, reverse=True)


# --- the manager's own log ---------------------------------------------------------------------
def test_each_running_writes_a_line_into_the_managers_own_log(mgr: ManagerProcess) -> None:
    reg = mgr.register(label())
    for _ in range(3):
        assert mgr.post("/running", json={"uuid": reg["uuid"]}).status_code == 200
    ours = [t for t in mgr.manager_log() if f"[running] uuid={reg['uuid']}" in t]
    assert len(ours) == 3
    assert all(re.match(GO_LOG_PREFIX + r"\[running\] uuid=", t) for t in ours)
    real = mgr.get("/api/manager-logs").json()  # the dashboard's view: the last 500
    assert any(line["text"] == ours[-1] and line["src"] == "manager" for line in real)
    assert mgr.post("/running", json={"uuid": "no-such"}).status_code == 404
    assert not any("uuid=no-such" in t for t in mgr.manager_log())


def test_the_managers_log_keeps_5000_lines_dropping_500_at_once(start: ManagerFactory) -> None:
    mgr = start()
    uuid = mgr.register("C.61")["uuid"]
    base = len(mgr.manager_log())  # the start line and the register
    for _ in range(5000 - base):
        mgr.post("/running", json={"uuid": uuid})
    texts = mgr.manager_log()
    assert len(texts) == 5000
    assert "API server listening on" in texts[0]
    mgr.post("/running", json={"uuid": uuid})
    texts = mgr.manager_log()
    assert len(texts) == 4501
    assert all("[running] uuid=" in t for t in texts)
    assert len(mgr.get("/api/manager-logs").json()) == 500
    assert len(mgr.get("/api/manager-logs", params={"tail": 4600}).json()) == 4501


# --- status codes and texts ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "message"),
    [
        ("POST", "/register", {"content": b'{"label": ""}'}, 400, "label is required"),
        ("POST", "/register", {"content": b"not json"}, 400,
         "bad request: invalid character 'o' in literal null (expecting 'u')"),
        ("POST", "/param-done", {"content": b""}, 400, "bad request: EOF"),
        ("POST", "/running", {"content": b"{"}, 400, "bad request: unexpected EOF"),
        ("POST", "/bench-done", {"content": b"[1]"}, 400,
         "bad request: json: cannot unmarshal array into Go value of type main.BenchDoneReq"),
        ("GET", "/runner-id", {}, 400, "uuid query param required"),
        ("POST", "/api/log-push", {"content": b"x"}, 400, "X-Instance-UUID header required"),
        ("POST", "/bad-host", {"json": {"reason": "r"}}, 400, "machine_id required"),
        ("POST", "/bad-host", {"content": b"{x"}, 400,
         "bad request: invalid character 'x' looking for beginning of object key string"),
        ("DELETE", "/bad-host/", {}, 400, "machine_id required in path"),
        ("POST", "/param-done", {"json": {"uuid": "nope"}}, 404, "instance not found"),
    ],
)  # fmt: skip
def test_error_codes_and_texts(
    mgr: ManagerProcess,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    message: str,
) -> None:
    r = mgr.http.request(method, path, **kwargs)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.text == json.dumps({"error": message}, separators=(",", ":")) + "\n"


def test_unknown_paths_and_the_dashboard(mgr: ManagerProcess) -> None:
    r = mgr.get("/register/")
    assert (r.status_code, r.text) == (404, "404 page not found\n")
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    ui = mgr.get("/")
    assert ui.status_code == 200
    assert ui.headers["content-type"].startswith("text/html")


def test_bad_hosts_listed_newest_first_replaced_and_removed(mgr: ManagerProcess) -> None:
    tag = uuidlib.uuid4().hex[:6]
    for machine, reason in ((f"{tag}-a", "one"), (f"{tag}-b", "two"), (f"{tag}-a", "three")):
        assert mgr.post("/bad-host", json={"machine_id": machine, "reason": reason}).json() == {
            "ok": True
        }
    ours = [h for h in mgr.get("/bad-host").json() if h["machine_id"].startswith(tag)]
    assert [(h["machine_id"], h["reason"]) for h in ours] == [
        (f"{tag}-a", "three"),
        (f"{tag}-b", "two"),
    ]
    assert all(STATUS_TIME.match(h["added_at"]) for h in ours)
    assert mgr.http.delete(f"/bad-host/{tag}-a").json() == {"ok": True}
    left = [h["machine_id"] for h in mgr.get("/bad-host").json() if h["machine_id"].startswith(tag)]
    assert left == [f"{tag}-b"]
