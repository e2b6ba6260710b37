"""``cuzk-supervisor prove``: bad input is exit 2 with one line; a good run prints per-proof
lines and a summary, against the in-process fake daemon."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from fakedaemon import Behaviour, FakeDaemon, free_port

from cuzk_supervisor.cli import main as cli

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _restore_logging():
    # The command configures structlog for the process (onto pytest's captured stderr).
    old = structlog.get_config()
    yield
    structlog.configure(**old)


@pytest.fixture
def c1_file(tmp_path) -> Path:
    path = tmp_path / "c1.json"
    phase1 = base64.b64encode(b'{"fake": "c1 output"}').decode()
    path.write_text(json.dumps({"SectorNum": 1, "Phase1Out": phase1, "SectorSize": 34359738368}))
    return path


def fast_flags(*extra: str) -> list[str]:
    return ["--await-deadline", "0.1", "--submit-deadline", "2", "--budget", "10", *extra]


@pytest.mark.parametrize(
    ("case", "argv"),
    [
        ("missing file", ["--addr", "127.0.0.1:9", "--c1", "{tmp}/nope.json"]),
        ("not json", ["--addr", "127.0.0.1:9", "--c1", "{tmp}/garbage.json"]),
        ("bad address", ["--addr", "localhost:9820", "--c1", "{c1}"]),
        ("bad address no port", ["--addr", "127.0.0.1", "--c1", "{c1}"]),
        ("unknown kind", ["--addr", "127.0.0.1:9", "--c1", "{c1}", "--kind", "c3"]),
        ("count 0", ["--addr", "127.0.0.1:9", "--c1", "{c1}", "--count", "0"]),
        ("concurrency 0", ["--addr", "127.0.0.1:9", "--c1", "{c1}", "--concurrency", "0"]),
        ("budget 0", ["--addr", "127.0.0.1:9", "--c1", "{c1}", "--budget", "0"]),
        (
            "await deadline nan",
            ["--addr", "127.0.0.1:9", "--c1", "{c1}", "--await-deadline", "nan"],
        ),
    ],
)
def test_bad_input_is_exit_2_with_one_line(case, argv, c1_file, tmp_path, capsys):
    (tmp_path / "garbage.json").write_text("{{{ not json")
    argv = [a.format(tmp=tmp_path, c1=c1_file) for a in argv]
    rc = cli.main(["prove", *argv])
    out, err = capsys.readouterr()
    assert rc == 2, case
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("cuzk-supervisor prove: error: ")
    assert "Traceback" not in err


def test_bad_c1_through_the_real_entry_point_is_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuzk_supervisor",
            "prove",
            "--addr",
            "127.0.0.1:9",
            "--c1",
            str(tmp_path / "missing.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"cuzk-supervisor prove: error: cannot read C1 file {tmp_path / 'missing.json'}: "
        "No such file or directory"
    ]


async def test_good_run_prints_one_line_per_proof_and_a_summary(c1_file, capsys):
    async with FakeDaemon(Behaviour(proof_s=0.25)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1", str(c1_file)]
        argv += fast_flags("--count", "3", "--concurrency", "2")
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 4, out
    proof_lines = lines[:3]
    assert sorted(line.split()[1] for line in proof_lines) == ["1/3", "2/3", "3/3"]
    for line in proof_lines:
        assert " ok " in line
        job_id = line.split()[2]
        assert job_id in fake.enqueued
        assert "wall " in line
        assert "daemon " in line
    assert lines[3].startswith("summary: 3 completed, 0 failed, wall ")
    assert "proofs/hour" in lines[3]
    assert "submissions 3, uploads cut 0)" in lines[3]
    assert all(" submissions 1" in line for line in proof_lines)
    assert len(set(fake.enqueued)) == 3
    assert fake.max_running <= 2
    assert fake.input_sizes == [c1_file.stat().st_size] * 3


async def test_json_summary(c1_file, capsys):
    async with FakeDaemon(Behaviour(proof_s=0.05)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1", str(c1_file), "--json"]
        argv += fast_flags("--count", "2")
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 0
    document = json.loads(out)
    assert (document["count"], document["completed"], document["failed"]) == (2, 2, 0)
    assert document["proofs_per_hour"] == pytest.approx(2 / document["wall_s"] * 3600, rel=0.01)
    assert sorted(p["job_id"] for p in document["proofs"]) == sorted(fake.enqueued)
    assert all(p["ok"] and p["submissions"] == 1 for p in document["proofs"])
    assert (document["submissions"], document["uploads_cut"]) == (2, 0)


async def test_a_submit_cut_before_it_landed_is_reported_apart_from_submissions(c1_file, capsys):
    # The first submit never lands (cut by its deadline); the await says NOT_FOUND; the second
    # lands. The daemon saw one submission: the JSON says so, and the cut one apart.
    async with FakeDaemon(Behaviour(proof_s=0.05, submit_hang=1)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1", str(c1_file), "--json"]
        argv += ["--await-deadline", "0.1", "--submit-deadline", "0.3", "--budget", "10"]
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 0
    document = json.loads(out)
    assert len(fake.enqueued) == 1
    assert (document["submissions"], document["uploads_cut"]) == (1, 1)
    (proof,) = document["proofs"]
    assert (proof["submissions"], proof["uploads_cut"]) == (1, 1)


async def test_failed_proof_is_exit_1_with_the_daemons_message(c1_file, capsys):
    async with FakeDaemon(Behaviour(fail_message="synthesis failed: bad C1")) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1", str(c1_file), *fast_flags()]
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 1
    assert " failed " in out
    assert "synthesis failed: bad C1" in out
    assert "summary: 0 completed, 1 failed" in out


async def test_daemon_not_answering_is_exit_1_with_one_line(c1_file, capsys):
    argv = ["prove", "--addr", f"127.0.0.1:{free_port()}", "--c1", str(c1_file)]
    argv += fast_flags("--ready-deadline", "0.5")
    rc = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    assert rc == 1
    assert out == ""
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1
    assert "not ready" in error_lines[0]
    assert "Traceback" not in err
