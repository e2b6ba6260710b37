"""The simulated manager's deploy path (``--vastai PROG``): ``POST /api/deploy`` runs
``PROG create instance``, the sweep reads ``PROG show instances --raw``, a destroyed container
runs ``PROG destroy instance ID``. PROG is a fake written here that records its argv."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from managerhelpers import ManagerFactory, ManagerProcess, poll_until, run_manager

ONSTART = "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
FAKE = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\\n")
mode_file = os.path.join(here, "mode")
mode = open(mode_file).read().strip() if os.path.exists(mode_file) else "ok"
if args[:2] == ["create", "instance"]:
    if mode == "fail":
        print("failed with error 400: no such offer", file=sys.stderr)
        sys.exit(1)
    if mode == "garbage":
        print("Started. nothing useful")
        sys.exit(0)
    print("Started. {{'success': True, 'new_contract': 7835610}}")
elif args[:2] == ["show", "instances"]:
    if mode == "show-fail":
        sys.exit(3)
    print(open(os.path.join(here, "instances.json")).read())
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    directory = tmp_path / "vast"
    directory.mkdir()
    prog = directory / "vastai"
    prog.write_text(FAKE.format(python=sys.executable))
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    (directory / "instances.json").write_text("[]")
    return prog


def calls(prog: Path) -> list[list[str]]:
    path = prog.parent / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def deploy(mgr: ManagerProcess, body: Any) -> tuple[int, Any]:
    response = mgr.post("/api/deploy", json=body)
    return response.status_code, response.json()


def env_of(secret: str = "s3cret") -> dict[str, str]:
    return {**os.environ, "PAVAIL": secret, "PAVAIL_SERVER": "pavail.example:4000"}


def create_argv(offer: int, env: str, image: str = "magik6k/curio-cuzk:latest") -> list[str]:
    return ["create", "instance", str(offer), "--image", image, "--disk", "250",
            "--env", env, "--ssh", "--direct", "--onstart-cmd", ONSTART]  # fmt: skip


def test_deploy_runs_create_instance_with_the_exact_argv(start: ManagerFactory, fake: Path) -> None:
    mgr = start("--vastai", str(fake), "--first-check", "1h", env=env_of())
    assert deploy(mgr, {"offer_id": 123}) == (200, {"ok": True, "instance_id": 7835610})
    assert deploy(mgr, {"offer_id": 456, "min_rate": 42}) == (
        200,
        {"ok": True, "instance_id": 7835610},
    )
    base = "-e PAVAIL=s3cret -e PAVAIL_SERVER=pavail.example:4000 -e MIN_RATE="
    assert calls(fake) == [
        create_argv(123, base + "30.0"),
        create_argv(456, base + "42.0"),
    ]
    assert mgr.state()["deploys"] == [
        {"offer_id": 123, "min_rate": 30.0, "instance_id": 7835610, "ok": True},
        {"offer_id": 456, "min_rate": 42.0, "instance_id": 7835610, "ok": True},
    ]
    log = [t for t in mgr.manager_log() if "[deploy]" in t]
    assert len(log) == 2
    assert all("7835610" in t for t in log)
    assert not any("s3cret" in t for t in mgr.manager_log())


def test_deploy_image_flag_and_unset_environment(start: ManagerFactory, fake: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PAVAIL", "PAVAIL_SERVER")}
    mgr = start("--vastai", str(fake), "--deploy-image", "me/img:1", "--first-check", "1h", env=env)
    assert deploy(mgr, {"offer_id": 9, "min_rate": 12.25})[0] == 200
    env_text = "-e PAVAIL= -e PAVAIL_SERVER= -e MIN_RATE=12.2"
    assert calls(fake) == [create_argv(9, env_text, "me/img:1")]


def test_deploy_errors(start: ManagerFactory, fake: Path) -> None:
    mgr = start("--vastai", str(fake), "--first-check", "1h", env=env_of())
    status, body = deploy(mgr, {"min_rate": 10})
    assert status == 400
    assert body["error"].startswith("bad request: ")
    status, body = deploy(mgr, {"offer_id": "12"})
    assert status == 400
    assert body["error"].startswith("bad request: json: cannot unmarshal")
    response = mgr.post("/api/deploy", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["error"].startswith("bad request: ")
    response = mgr.get("/api/deploy")
    assert (response.status_code, response.text) == (405, "method not allowed\n")
    assert calls(fake) == []

    (fake.parent / "mode").write_text("fail")
    status, body = deploy(mgr, {"offer_id": 5})
    assert status == 500
    assert body["error"].startswith("vastai create failed: exit status 1")
    assert "no such offer" in body["error"]
    (fake.parent / "mode").write_text("garbage")
    status, body = deploy(mgr, {"offer_id": 6})
    assert status == 500
    assert body["error"].startswith("vastai create failed: no new_contract")
    assert [d["ok"] for d in mgr.state()["deploys"]] == [False, False]
    assert [d["instance_id"] for d in mgr.state()["deploys"]] == [None, None]
    assert not any("s3cret" in t for t in mgr.manager_log())


def test_deploy_without_vastai_is_not_configured(start: ManagerFactory) -> None:
    mgr = start("--first-check", "1h")
    assert deploy(mgr, {"offer_id": 1}) == (500, {"error": "deploy not configured"})


def test_vastai_and_instances_exclude_each_other(tmp_path: Path, fake: Path) -> None:
    db, listing = str(tmp_path / "m.db"), str(tmp_path / "i.json")
    result = run_manager("--db", db, "--vastai", str(fake), "--instances", listing)
    assert result.returncode == 2
    assert "--instances" in result.stderr


def test_a_failed_bench_destroys_the_instance(start: ManagerFactory, fake: Path) -> None:
    mgr = start("--vastai", str(fake), "--first-check", "1h")
    reg = mgr.register("C.4242", min_rate=50)
    response = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 10})
    assert response.json() == {"ok": True, "passed": False}
    poll_until(lambda: ["destroy", "instance", "4242"] in calls(fake), 10, what="destroy")

    assert mgr.api_kill(vast_id=777).status_code == 200
    poll_until(lambda: ["destroy", "instance", "777"] in calls(fake), 10, what="kill destroy")


def test_the_sweep_reads_show_instances_raw(start: ManagerFactory, fake: Path) -> None:
    (fake.parent / "instances.json").write_text(json.dumps([{"id": 11, "label": "C.11"}]))
    mgr = start("--vastai", str(fake), "--first-check", "1h")
    kept, gone = mgr.register("C.11"), mgr.register("C.12")
    result = mgr.sweep()
    assert [(k["uuid"], k["cause"]) for k in result["kills"]] == [(gone["uuid"], "disappeared")]
    assert ["show", "instances", "--raw"] in calls(fake)
    states = {i["uuid"]: i for i in mgr.instances()}
    assert states[gone["uuid"]]["kill_reason"] == "instance disappeared from vast"
    assert states[kept["uuid"]]["state"] == "registered"
    assert mgr.state()["platform"] == [{"id": 11, "label": "C.11", "machine_id": None}]

    (fake.parent / "mode").write_text("show-fail")
    (fake.parent / "instances.json").write_text("[]")
    assert mgr.sweep()["kills"] == []
    assert "vastai show instances" in mgr.state()["sweeps"]["error"]
    (fake.parent / "mode").write_text("ok")
    (fake.parent / "instances.json").write_text("{bad")
    assert mgr.sweep()["kills"] == []
    assert mgr.state()["sweeps"]["error"].startswith("enumerate vast instances")
    assert {i["uuid"]: i for i in mgr.instances()}[kept["uuid"]]["state"] == "registered"


def test_the_periodic_sweep_uses_vastai(start: ManagerFactory, fake: Path) -> None:
    mgr = start("--vastai", str(fake), "--time-scale", "100")
    reg = mgr.register("C.99")
    poll_until(
        lambda: any(i["uuid"] == reg["uuid"] and i["state"] == "killed" for i in mgr.instances()),
        10,
        what="disappeared at the periodic sweep",
    )
