"""``POST /api/log-push`` and ``GET /api/instance-logs/{uuid}`` of the simulated manager."""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from managerhelpers import ManagerProcess

LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def mgr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    db: Path = tmp_path_factory.mktemp("manager") / "manager.db"
    with ManagerProcess.start(db) as process:
        yield process


@pytest.fixture
def uuid(mgr: ManagerProcess) -> str:
    return str(mgr.register(f"C.{uuidlib.uuid4().hex[:12]}")["uuid"])


def push(
    mgr: ManagerProcess, uuid: str | None, body: bytes | str, source: str | None = None
) -> httpx.Response:
    headers = {}
    if uuid is not None:
        headers["X-Instance-UUID"] = uuid
    if source is not None:
        headers["X-Log-Source"] = source
    content = body.encode() if isinstance(body, str) else body
    return mgr.post("/api/log-push", content=content, headers=headers)


def logs(mgr: ManagerProcess, uuid: str, **params: object) -> list[dict]:
    r = mgr.get(f"/api/instance-logs/{uuid}", params=params)
    assert r.status_code == 200, r.text
    return list(r.json())


def test_push_answers_204_empty_and_stores_lines(mgr: ManagerProcess, uuid: str) -> None:
    r = push(mgr, uuid, "phase=register\nphase=params\n", source="setup")
    assert r.status_code == 204
    assert r.content == b""
    got = logs(mgr, uuid)
    assert [(line["src"], line["text"]) for line in got] == [
        ("setup", "phase=register"),
        ("setup", "phase=params"),
    ]
    for line in got:
        assert set(line) == {"src", "text", "ts"}
        assert isinstance(line["ts"], int)  # integer milliseconds
        # The receive time on the wall clock, in ms (a unit or clock mix-up is hours or years
        # off), not how fast it came.
        assert abs(line["ts"] / 1000 - time.time()) < 60


def test_lines_of_one_push_share_the_receive_time(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, "a\nb\nc")
    stamps = {line["ts"] for line in logs(mgr, uuid)}
    assert len(stamps) == 1


def test_source_defaults_to_unknown(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, "no source header")
    push(mgr, uuid, "empty source header", source="")
    assert [line["src"] for line in logs(mgr, uuid)] == ["unknown", "unknown"]


@pytest.mark.parametrize("header", [None, ""])
def test_push_without_instance_uuid_is_400(mgr: ManagerProcess, header: str | None) -> None:
    r = push(mgr, header, "orphan line")
    assert r.status_code == 400
    assert "error" in r.json()


def test_empty_lines_dropped_and_carriage_returns_kept(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, "\n\nfirst\n\n\nsecond\r\n\r\nthird")
    # split on \n only, as the real manager: "\r" stays, and a line of only "\r" is not empty
    assert [line["text"] for line in logs(mgr, uuid)] == ["first", "second\r", "\r", "third"]


def test_an_empty_push_stores_nothing(mgr: ManagerProcess, uuid: str) -> None:
    assert push(mgr, uuid, b"").status_code == 204
    assert logs(mgr, uuid) == []


def test_only_the_first_256_kib_of_a_push_is_read(mgr: ManagerProcess, uuid: str) -> None:
    # 300 KiB of numbered 100-byte lines (99 characters + newline)
    lines = [f"{n:06d}".ljust(99, "x") for n in range(300 * 1024 // 100 + 1)]
    body = ("\n".join(lines) + "\n").encode()[: 300 * 1024]
    r = push(mgr, uuid, body, source="benchout")
    assert r.status_code == 204
    stored = [line["text"] for line in logs(mgr, uuid, tail=10_000)]
    expected = [line for line in body[:LIMIT].decode().split("\n") if line]
    assert stored == expected
    assert len(stored) == LIMIT // 100 + 1  # 2621 whole lines and the cut one
    assert stored[-1] == lines[LIMIT // 100][: LIMIT % 100]  # cut at the limit, kept cut
    assert sum(len(text) + 1 for text in stored) == LIMIT + 1
    # the rest of the body was silently dropped, and the connection still works
    entry = mgr.requests(path="/api/log-push")[-1]
    assert entry["body_bytes"] == 300 * 1024
    assert entry["lines_stored"] == len(stored)
    assert push(mgr, uuid, "after the big one").status_code == 204


def test_chunked_push_is_read_the_same_way(mgr: ManagerProcess, uuid: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"one\ntw"
        yield b"o\n"
        yield b"three\n"

    r = mgr.post("/api/log-push", content=chunks(), headers={"X-Instance-UUID": uuid})
    assert r.status_code == 204
    assert [line["text"] for line in logs(mgr, uuid)] == ["one", "two", "three"]


def test_invalid_utf8_becomes_replacement_characters(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, b"bad \xff byte")
    assert logs(mgr, uuid)[0]["text"] == "bad \ufffd byte"


def test_source_and_tail_filters(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, "s1\ns2", source="setup")
    push(mgr, uuid, "c1\nc2\nc3", source="cuzk")
    push(mgr, uuid, "s3", source="setup")
    assert [line["text"] for line in logs(mgr, uuid)] == ["s1", "s2", "c1", "c2", "c3", "s3"]
    assert [line["text"] for line in logs(mgr, uuid, source="setup")] == ["s1", "s2", "s3"]
    assert [line["text"] for line in logs(mgr, uuid, tail=2)] == ["c3", "s3"]
    assert [line["text"] for line in logs(mgr, uuid, source="cuzk", tail=2)] == ["c2", "c3"]
    assert [line["text"] for line in logs(mgr, uuid, source="curio")] == []
    assert len(logs(mgr, uuid, tail=0)) == 6  # not a usable tail: the default 1,000
    assert len(logs(mgr, uuid, tail=100)) == 6


def test_instances_do_not_share_logs(mgr: ManagerProcess, uuid: str) -> None:
    other = str(mgr.register(f"C.{uuidlib.uuid4().hex[:12]}")["uuid"])
    push(mgr, uuid, "mine")
    push(mgr, other, "theirs")
    assert [line["text"] for line in logs(mgr, uuid)] == ["mine"]
    assert [line["text"] for line in logs(mgr, other)] == ["theirs"]


def test_unknown_instance_has_no_logs(mgr: ManagerProcess) -> None:
    assert logs(mgr, "no-such-instance") == []


def test_a_full_buffer_drops_its_oldest_1000_at_once(mgr: ManagerProcess, uuid: str) -> None:
    push(mgr, uuid, "\n".join(f"a{n}" for n in range(6000)))
    push(mgr, uuid, "\n".join(f"b{n}" for n in range(4000)))
    got = [line["text"] for line in logs(mgr, uuid, tail=20_000)]
    assert len(got) == 10_000  # full, nothing dropped yet
    assert got[0] == "a0"
    push(mgr, uuid, "c0")  # line 10,001: the oldest 1,000 go at once
    got = [line["text"] for line in logs(mgr, uuid, tail=20_000)]
    assert len(got) == 9_001
    assert (got[0], got[-1]) == ("a1000", "c0")
    push(mgr, uuid, "\n".join(f"d{n}" for n in range(3000)))  # full again at every 1,000th
    got = [line["text"] for line in logs(mgr, uuid, tail=20_000)]
    assert len(got) == 9_001
    assert (got[0], got[-1]) == ("a4000", "d2999")


def test_journal_records_log_source_and_size(mgr: ManagerProcess, uuid: str) -> None:
    since = mgr.requests()[-1]["seq"]
    push(mgr, uuid, "x\ny\n", source="benchdaemon")
    push(mgr, uuid, "z")
    pushes = mgr.requests(since=since, path="/api/log-push")
    assert [
        (e["log_source"], e["body_bytes"], e["status"], e["instance_uuid"]) for e in pushes
    ] == [
        ("benchdaemon", 4, 204, uuid),
        (None, 1, 204, uuid),
    ]
