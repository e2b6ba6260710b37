"""The simulated manager behind a bad proxy (issue "a hostile and unlucky field"): 502/503
with an HTML body on a share of requests, 200s whose body is not the expected JSON, and a
200 HTML maintenance page answering ``/register`` first. Each seeded, each switchable by flag,
environment and ``POST /sim/faults``, against the sim manager as a real process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from managerhelpers import ManagerFactory, ManagerProcess


@pytest.fixture
def start(tmp_path: Path) -> Iterator[ManagerFactory]:
    with ManagerFactory(tmp_path) as factory:
        yield factory


def registers(mgr: ManagerProcess, count: int, prefix: str = "C.") -> list[httpx.Response]:
    return [
        mgr.post("/register", json={"label": f"{prefix}{n}", "min_rate": 0}) for n in range(count)
    ]


def expected_register(r: httpx.Response) -> bool:
    """The answer a client can use: 200 JSON with a uuid and a runner id."""
    if r.status_code != 200 or r.headers.get("content-type") != "application/json":
        return False
    try:
        body = r.json()
    except json.JSONDecodeError:
        return False
    return isinstance(body, dict) and {"uuid", "runner_id"} <= set(body)


def labels(mgr: ManagerProcess) -> set[str]:
    return {inst["label"] for inst in mgr.instances()}


def journal(mgr: ManagerProcess, path: str = "/register") -> list[dict[str, Any]]:
    return mgr.requests(path=path)


# --- 502/503 with an HTML body ----------------------------------------------------------------
def test_html_rate_answers_a_share_with_a_proxys_html_page(start: ManagerFactory) -> None:
    mgr = start("--html-rate", "0.5", "--seed", "3")
    answers = registers(mgr, 200)
    html = [r for r in answers if r.status_code in (502, 503)]
    assert 70 <= len(html) <= 130, len(html)  # half of 200, give or take
    assert {r.status_code for r in html} == {502, 503}  # both drawn by default
    for r in html:
        assert r.headers["content-type"] == "text/html"
        assert r.text.startswith("<html>")
        assert ("502 Bad Gateway" if r.status_code == 502 else "503 Service") in r.text
        with pytest.raises(json.JSONDecodeError):
            r.json()
    others = [r for r in answers if r.status_code not in (502, 503)]
    assert all(expected_register(r) for r in others)
    # an HTML answer was never applied: exactly the answered labels exist
    answered = {f"C.{n}" for n, r in enumerate(answers) if expected_register(r)}
    assert labels(mgr) == answered
    entries = journal(mgr)
    assert [e["fault"] for e in entries] == [
        "html" if r.status_code in (502, 503) else None for r in answers
    ]
    assert [e["applied"] for e in entries] == [expected_register(r) for r in answers]


def test_html_status_picks_the_statuses(start: ManagerFactory) -> None:
    mgr = start("--html-rate", "1", "--html-status", "503")
    assert {r.status_code for r in registers(mgr, 20)} == {503}
    assert labels(mgr) == set()


def test_the_same_seed_gives_the_same_html_answers(start: ManagerFactory, tmp_path: Path) -> None:
    def pattern(seed: str, db: str) -> list[int]:
        mgr = start("--html-rate", "0.4", "--seed", seed, db=tmp_path / db)
        return [r.status_code for r in registers(mgr, 60)]

    first, again, other = pattern("8", "a.db"), pattern("8", "b.db"), pattern("9", "c.db")
    assert first == again
    assert first != other


# --- 200 with a body that is not the expected JSON -------------------------------------------
def test_bad_body_rate_answers_200_with_a_body_that_is_not_the_expected_json(
    start: ManagerFactory,
) -> None:
    mgr = start("--bad-body-rate", "0.4", "--seed", "5")
    answers = registers(mgr, 150)
    assert all(r.status_code == 200 for r in answers)
    bad = [r for r in answers if not expected_register(r)]
    assert 35 <= len(bad) <= 85, len(bad)
    kinds = {e["fault"] for e in journal(mgr)} - {None}
    assert kinds == {"bad_body"}
    bodies = {r.content for r in bad}
    assert b"" in bodies  # empty
    assert b'{"ok":tr' in bodies  # JSON cut short
    assert any(body.startswith(b"<html>") for body in bodies)  # a proxy's HTML page
    assert b"OK\n" in bodies  # plain text
    assert any(b'"status":"ok"' in body for body in bodies)  # JSON without uuid/runner_id
    # not applied by default: a bad answer registered nothing
    answered = {f"C.{n}" for n, r in enumerate(answers) if expected_register(r)}
    assert labels(mgr) == answered


def test_bad_body_kinds_can_be_chosen(start: ManagerFactory) -> None:
    mgr = start("--bad-body-rate", "1", "--bad-body-kind", "truncated")
    answers = registers(mgr, 10)
    assert {(r.status_code, r.content) for r in answers} == {(200, b'{"ok":tr')}


def test_bad_body_applied_changes_state_but_loses_the_answer(start: ManagerFactory) -> None:
    """The manager applied the report, the answer was mangled on its way back: only a look
    at GET /status tells the client that its report arrived."""
    mgr = start("--bad-body-rate", "1", "--bad-body-applied", "--fault-path", "/bench-done")
    reg = mgr.register("C.9")
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 70})
    assert r.status_code == 200
    assert not (r.headers["content-type"] == "application/json" and "passed" in r.text)
    inst = mgr.instance(reg["uuid"])
    assert inst is not None
    assert (inst["state"], inst["bench_rate"]) == ("bench_done", 70)
    (entry,) = journal(mgr, "/bench-done")
    assert (entry["faulted"], entry["fault"], entry["applied"]) == (True, "bad_body", True)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/param-done", {}), ("/bench-done", {"rate": 10}), ("/running", {})],
)
def test_a_bad_body_report_is_not_applied(
    start: ManagerFactory, path: str, body: dict[str, Any]
) -> None:
    mgr = start()
    reg = mgr.register("C.1")
    before = mgr.instance(reg["uuid"])
    mgr.faults(bad_body_rate=1, bad_body_kinds=["wrong_json"])
    r = mgr.post(path, json={"uuid": reg["uuid"], **body})
    assert (r.status_code, r.json()) == (200, {"status": "ok", "message": "accepted"})
    assert mgr.instance(reg["uuid"]) == before
    assert mgr.state()["kills"] == []


# --- /register first answered by a maintenance page -------------------------------------------
def test_register_answered_first_by_a_maintenance_page(start: ManagerFactory) -> None:
    mgr = start("--maintenance-next", "2")
    for _ in range(2):
        r = mgr.post("/register", json={"label": "C.1", "min_rate": 0})
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "Down for maintenance" in r.text
        assert labels(mgr) == set()  # not applied
        assert mgr.get("/status").status_code == 200  # other paths are served meanwhile
    assert mgr.faults()["maintenance_next"] == 0
    r = mgr.post("/register", json={"label": "C.1", "min_rate": 0})
    assert expected_register(r)
    assert labels(mgr) == {"C.1"}
    assert [e["fault"] for e in journal(mgr)] == ["maintenance", "maintenance", None]


def test_maintenance_path_can_be_another_path(start: ManagerFactory) -> None:
    mgr = start("--maintenance-next", "1", "--maintenance-path", "/bench-done")
    reg = mgr.register("C.1")  # not faulted
    r = mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 70})
    assert "Down for maintenance" in r.text
    assert mgr.post("/bench-done", json={"uuid": reg["uuid"], "rate": 70}).json()["passed"]


# --- switched by environment and at run time; stacked ------------------------------------------
def test_switched_from_the_environment(start: ManagerFactory) -> None:
    mgr = start(env={"CUZK_SIM_MANAGER_FAULTS": "html_rate=1,html_statuses=502,maintenance_next=1"})
    first = mgr.post("/register", json={"label": "C.1"})
    assert "Down for maintenance" in first.text  # the maintenance page comes first
    assert mgr.post("/register", json={"label": "C.1"}).status_code == 502


def test_switched_at_run_time(start: ManagerFactory) -> None:
    mgr = start()
    view = mgr.faults(html_rate=1, html_statuses=[503])
    assert (view["html_rate"], view["html_statuses"]) == (1, [503])
    assert mgr.post("/register", json={"label": "C.1"}).status_code == 503
    mgr.faults(html_rate=0, maintenance_next=1)
    assert "Down for maintenance" in mgr.post("/register", json={"label": "C.1"}).text
    assert expected_register(mgr.post("/register", json={"label": "C.1"}))


def test_rates_stack_in_one_draw(start: ManagerFactory) -> None:
    mgr = start("--fail-rate", "0.2", "--html-rate", "0.3", "--bad-body-rate", "0.1",
                "--seed", "13")  # fmt: skip
    answers = registers(mgr, 400)
    faults = [e["fault"] for e in journal(mgr)]
    shares = {kind: faults.count(kind) / len(faults) for kind in ("error", "html", "bad_body")}
    assert 0.13 <= shares["error"] <= 0.27, shares
    assert 0.22 <= shares["html"] <= 0.38, shares
    assert 0.05 <= shares["bad_body"] <= 0.16, shares
    assert sum(expected_register(r) for r in answers) == faults.count(None)


@pytest.mark.parametrize(
    "body",
    [
        {"html_rate": 2},
        {"html_statuses": [200]},
        {"html_statuses": []},
        {"bad_body_kinds": ["nope"]},
        {"bad_body_applied": "perhaps"},
        {"maintenance_next": -1},
        {"maintenance_path": "register"},
    ],
)
def test_bad_proxy_fault_settings_are_400(start: ManagerFactory, body: dict[str, Any]) -> None:
    mgr = start()
    before = mgr.faults()
    r = mgr.post("/sim/faults", json=body)
    assert r.status_code == 400
    assert next(iter(body)) in r.json()["error"]
    assert mgr.faults() == before


# --- a proxy's own pages (issue 31) ---------------------------------------------------------
PAGES = {
    "html404": (404, "text/html", "404 Not Found", "nginx/1.25.3"),
    "html403": (403, "text/html", "403 Forbidden", "nginx/1.25.3"),
    "html401": (401, "text/html", "401 Authorization Required", "nginx/1.25.3"),
    "html413": (413, "text/html", "413 Request Entity Too Large", "nginx/1.25.3"),
    "go404": (404, "text/plain; charset=utf-8", "404 page not found", None),
    "json404": (404, "application/json; charset=utf-8", "no Route matched", "kong/3.6.1"),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_proxy_next_answers_with_the_page_never_applied(start: ManagerFactory, page: str) -> None:
    mgr = start("--proxy-page", page)
    reg = mgr.register("C.1")
    mgr.faults(proxy_next=1, proxy_pages=[page])
    r = mgr.post("/running", json={"uuid": reg["uuid"]})
    status, content_type, text, server = PAGES[page]
    assert (r.status_code, r.headers.get("content-type")) == (status, content_type)
    assert text in r.text
    assert r.headers.get("server") == server
    assert (mgr.instance(reg["uuid"]) or {}).get("state") == "registered"  # not applied
    entry = journal(mgr, "/running")[-1]
    assert (entry["faulted"], entry["fault"], entry["applied"]) == (True, "proxy", False)
    assert mgr.post("/running", json={"uuid": reg["uuid"]}).status_code == 200


def test_an_empty_404_and_a_reset(start: ManagerFactory) -> None:
    mgr = start()
    reg = mgr.register("C.1")
    mgr.faults(proxy_next=1, proxy_pages=["empty404"])
    r = mgr.post("/param-done", json={"uuid": reg["uuid"]})
    assert (r.status_code, r.content) == (404, b"")
    mgr.faults(proxy_next=1, proxy_pages=["reset"])
    with mgr.client() as client, pytest.raises(httpx.TransportError):
        client.post("/param-done", json={"uuid": reg["uuid"]})
    assert journal(mgr, "/param-done")[-1]["fault"] == "reset"
    assert (mgr.instance(reg["uuid"]) or {}).get("state") == "registered"


def test_proxy_rate_answers_a_share_drawn_among_the_pages(start: ManagerFactory) -> None:
    mgr = start("--proxy-rate", "0.5", "--proxy-page", "html404", "--proxy-page", "html403",
                "--seed", "5")  # fmt: skip
    answers = registers(mgr, 200)
    pages = [r for r in answers if r.status_code in (403, 404)]
    assert 70 <= len(pages) <= 130, len(pages)
    assert {r.status_code for r in pages} == {403, 404}
    assert sum(expected_register(r) for r in answers) == 200 - len(pages)


def test_an_unknown_proxy_page_is_refused(start: ManagerFactory) -> None:
    mgr = start()
    with mgr.client() as client:
        r = client.post("/sim/faults", json={"proxy_pages": ["html200"]})
    assert r.status_code == 400
    assert "unknown proxy page" in r.text
