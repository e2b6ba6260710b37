"""``cuzk-supervisor prove``: bad input is exit 2 with one line; a daemon that never answers is
exit 3 naming its address; a good run prints per-proof lines and a summary with the rate in wall
and daemon time; its settings are the product's (flags, environment, config file); progress is
reported while proofs run (events off a terminal, the terminal view on one). Against the
in-process fake daemon; the same against the simulator is in test_acceptance_proving.py."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from fakedaemon import Behaviour, FakeDaemon, free_port
from ptyhelpers import emulate, run_on_a_terminal

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.proving.daemonstatus import read_sample, status_address
from cuzk_supervisor.adapters.proving.results import (
    BatchResult,
    DaemonTimings,
    ProofResult,
    ProofStatus,
    summarize_batch,
)
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.cli.commands import prove, proveprogress, provereport
from cuzk_supervisor.core.boundsample import parse_status
from cuzk_supervisor.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _restore_logging():
    # The command configures structlog for the process (onto pytest's captured stderr).
    old = structlog.get_config()
    yield
    structlog.configure(**old)


@pytest.fixture(autouse=True)
def _no_settings_from_the_host(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CUZK_SUPERVISOR_"):
            monkeypatch.delenv(name)


@pytest.fixture
def c1_file(tmp_path) -> Path:
    path = tmp_path / "c1.json"
    phase1 = base64.b64encode(b'{"fake": "c1 output"}').decode()
    path.write_text(json.dumps({"SectorNum": 1, "Phase1Out": phase1, "SectorSize": 34359738368}))
    return path


def fast_flags(*extra: str) -> list[str]:
    return [
        "--await-deadline-s", "0.1", "--submit-deadline-s", "2", "--proof-budget-s", "10", *extra
    ]  # fmt: skip


def events(err: str, name: str | None = None) -> list[dict]:
    found = []
    for line in err.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if name is None or event["event"] == name:
                found.append(event)
    return found


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_SUPERVISOR_")}
    return {**env, **extra}


# --- input and flags --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "argv"),
    [
        ("missing file", ["--addr", "127.0.0.1:9", "--c1-file", "{tmp}/nope.json"]),
        ("not json", ["--addr", "127.0.0.1:9", "--c1-file", "{tmp}/garbage.json"]),
        ("bad address", ["--addr", "localhost:9820", "--c1-file", "{c1}"]),
        ("bad address no port", ["--addr", "127.0.0.1", "--c1-file", "{c1}"]),
        ("unknown kind", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--kind", "c3"]),
        ("count 0", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--count", "0"]),
        ("concurrency 0", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--concurrency", "0"]),
        ("budget 0", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--proof-budget-s", "0"]),
        ("ready 0", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--ready-deadline-s", "0"]),
        (
            "await deadline nan",
            ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--await-deadline-s", "nan"],
        ),
        ("bad log level", ["--addr", "127.0.0.1:9", "--c1-file", "{c1}", "--log-level", "loud"]),
        ("missing config file", ["--addr", "127.0.0.1:9", "--config-file", "{tmp}/none.toml"]),
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


@pytest.mark.parametrize(
    "old",
    [
        ["--c1", "{c1}"],
        ["--budget", "10"],
        ["--await-deadline", "1"],
        ["--submit-deadline", "1"],
        ["--ready-deadline", "1"],
    ],
)
def test_the_old_flag_names_are_refused(old, c1_file, capsys):
    # One name per setting, the product's: --c1 is not taken as an abbreviation of --c1-file.
    argv = ["prove", "--addr", "127.0.0.1:9", "--c1-file", str(c1_file)]
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, *(a.format(c1=c1_file) for a in old)])
    assert exited.value.code == 2
    assert f"unrecognized arguments: {old[0]}" in capsys.readouterr().err


def test_the_help_names_the_shared_settings():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)  # the subcommands' parsers by name
    text = sub.choices["prove"].format_help()
    for flag in (
        "--c1-file",
        "--proof-budget-s",
        "--await-deadline-s",
        "--submit-deadline-s",
        "--config-file",
        "--log-level",
    ):
        assert flag in text
    assert "CUZK_SUPERVISOR_" in text
    assert "default: 1800" in text  # proof_budget_s's own default, not a 3600 of its own
    assert "--budget " not in text
    assert "--c1 " not in text


def test_bad_c1_through_the_real_entry_point_is_one_line(tmp_path):
    missing = tmp_path / "missing.json"
    argv = ["prove", "--addr", "127.0.0.1:9", "--c1-file", str(missing)]
    proc = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", *argv],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"cuzk-supervisor prove: error: cannot read C1 file {missing}: No such file or directory"
    ]


# --- proving ----------------------------------------------------------------------------------


async def test_good_run_prints_one_line_per_proof_and_a_summary(c1_file, capsys):
    async with FakeDaemon(Behaviour(proof_s=0.25)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file)]
        argv += fast_flags("--count", "3", "--concurrency", "2")
        rc = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
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
    assert "proofs/hour in daemon time" in lines[3]
    assert "submissions 3, uploads cut 0)" in lines[3]
    assert all(" submissions 1" in line for line in proof_lines)
    assert len(set(fake.enqueued)) == 3
    assert fake.max_running <= 2
    assert fake.input_sizes == [c1_file.stat().st_size] * 3
    # Off a terminal every event is a JSON line on stderr, each once.
    (summary,) = events(err, proveprogress.EVENT_SUMMARY)
    assert (summary["completed"], summary["failed"]) == (3, 0)
    assert len(events(err, proveprogress.EVENT_STARTED)) == 1


async def test_json_summary_has_the_rate_in_wall_and_daemon_time(c1_file, capsys):
    async with FakeDaemon(Behaviour(proof_s=0.3)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file), "--json"]
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
    # The fake's clock is the wall clock: its total_ms says one daemon second per second.
    assert document["daemon_seconds_per_second"] == pytest.approx(1.0, rel=0.2)
    assert document["daemon_proofs_per_hour"] == pytest.approx(
        2 / document["daemon_wall_s"] * 3600, rel=0.01
    )


async def test_a_submit_cut_before_it_landed_is_reported_apart_from_submissions(c1_file, capsys):
    # The first submit never lands (cut by its deadline); the await says NOT_FOUND; the second
    # lands. The daemon saw one submission: the JSON says so, and the cut one apart.
    async with FakeDaemon(Behaviour(proof_s=0.05, submit_hang=1)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file), "--json"]
        argv += ["--await-deadline-s", "0.1", "--submit-deadline-s", "0.3"]
        argv += ["--proof-budget-s", "10"]
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
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file), *fast_flags()]
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 1
    assert " failed " in out
    assert "synthesis failed: bad C1" in out
    assert "summary: 0 completed, 1 failed" in out
    assert "daemon time unknown" in out


async def test_daemon_not_answering_is_exit_3_naming_the_address(c1_file, capsys, monkeypatch):
    monkeypatch.setattr(proveprogress, "PROGRESS_INTERVAL_S", 0.1)
    address = f"127.0.0.1:{free_port()}"
    argv = ["prove", "--addr", address, "--c1-file", str(c1_file)]
    argv += fast_flags("--ready-deadline-s", "0.6")
    rc = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    assert rc == 3
    assert out == ""
    error_lines = [line for line in err.splitlines() if line.startswith("cuzk-supervisor prove")]
    assert len(error_lines) == 1
    assert error_lines[0].startswith("cuzk-supervisor prove: error: ")
    assert address in error_lines[0]
    assert "not ready" in error_lines[0]
    assert "Traceback" not in err
    # Not silent while it waits: events that name the address.
    waiting = events(err, proveprogress.EVENT_WAITING)
    assert waiting
    assert all(w["address"] == address for w in waiting)


# --- settings: environment, file, default address ---------------------------------------------


async def test_environment_gives_the_c1_file_and_the_daemons_address(c1_file, capsys, monkeypatch):
    async with FakeDaemon(Behaviour(proof_s=0.05)) as fake:
        monkeypatch.setenv("CUZK_SUPERVISOR_C1_FILE", str(c1_file))
        monkeypatch.setenv("CUZK_SUPERVISOR_DAEMON_LISTEN", str(fake.address))
        monkeypatch.setenv("CUZK_SUPERVISOR_AWAIT_DEADLINE_S", "0.1")
        rc = await asyncio.to_thread(cli.main, ["prove", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    document = json.loads(out)
    assert document["address"] == str(fake.address)
    assert document["completed"] == 1
    assert fake.input_sizes == [c1_file.stat().st_size]
    # Cut every 0.1 s (the environment's await deadline, not the default 30 s).
    assert document["proofs"][0]["await_attempts"] >= 1


async def test_without_addr_it_asks_the_socket_in_run_dir(c1_file, tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    async with FakeDaemon(Behaviour(proof_s=0.05), unix_path=run_dir / "cuzk.sock") as fake:
        monkeypatch.setenv("CUZK_SUPERVISOR_RUN_DIR", str(run_dir))
        argv = ["prove", "--c1-file", str(c1_file), "--json", *fast_flags()]
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 0
    assert json.loads(out)["address"] == f"unix://{(run_dir / 'cuzk.sock').resolve()}"
    assert len(fake.completed) == 1


async def test_config_file_gives_the_c1_file_and_the_proof_budget(c1_file, tmp_path, capsys):
    config = tmp_path / "supervisor.toml"
    config.write_text(f'c1_file = "{c1_file}"\nproof_budget_s = 1\nawait_deadline_s = 0.2\n')
    async with FakeDaemon(Behaviour(proof_s=3.0)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--config-file", str(config), "--json"]
        rc = await asyncio.to_thread(cli.main, argv)
    out, _ = capsys.readouterr()
    assert rc == 1
    (proof,) = json.loads(out)["proofs"]
    assert proof["status"] == "budget_exhausted"
    assert "(budget 1 s)" in proof["error"]
    assert fake.input_sizes == [c1_file.stat().st_size]


async def test_a_flag_wins_over_the_environment(c1_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUZK_SUPERVISOR_C1_FILE", str(tmp_path / "not-this-one.json"))
    async with FakeDaemon(Behaviour(proof_s=0.05)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file), *fast_flags()]
        rc = await asyncio.to_thread(cli.main, argv)
    capsys.readouterr()
    assert rc == 0
    assert len(fake.completed) == 1


# --- progress ---------------------------------------------------------------------------------


async def test_progress_events_while_a_proof_runs(c1_file, capsys, monkeypatch):
    # The cadence shortened (5 s in use) so a short proof shows several.
    monkeypatch.setattr(proveprogress, "PROGRESS_INTERVAL_S", 0.2)
    async with FakeDaemon(Behaviour(proof_s=1.5)) as fake:
        argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file), *fast_flags()]
        rc = await asyncio.to_thread(cli.main, argv)
    _, err = capsys.readouterr()
    assert rc == 0
    ticks = events(err, proveprogress.EVENT_PROGRESS)
    assert len(ticks) >= 3, err
    assert all((t["proof"], t["count"], t["running"]) == (1, 1, 1) for t in ticks)
    ages = [t["proof_elapsed_s"] for t in ticks]
    assert ages == sorted(ages)
    assert ages[-1] > ages[0]
    assert all("partitions_done" not in t for t in ticks)  # the fake has no HTTP status


@pytest.mark.slow
def test_on_a_terminal_a_person_sees_the_terminal_view(c1_file):
    # The view of run and sim: a live line while the proof runs, a line for the proof, the
    # summary with both rates, the exit; no JSON line and no plain stdout line on the terminal.
    async def scenario() -> tuple[int, str]:
        async with FakeDaemon(Behaviour(proof_s=2.5)) as fake:
            argv = ["prove", "--addr", str(fake.address), "--c1-file", str(c1_file)]
            command = [sys.executable, "-m", "cuzk_supervisor", *argv, *fast_flags()]
            return await asyncio.to_thread(run_on_a_terminal, command, 60)

    rc, raw = asyncio.run(scenario())
    shown = [line for line in emulate(raw) if line.strip()]
    report = "\n".join(shown)
    assert rc == 0, report
    # The live line was drawn (rich erases it at the end: it is in what was written).
    drawn = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", raw)
    assert re.search(r"prove +\d+(\.\d)?s  proof 1/1 running", drawn), drawn[-2000:]
    assert not any("running" in line for line in shown), report  # and gone at the end
    (proof,) = [line for line in shown if line.startswith(" ✓ proof 1/1")]
    assert "ok, daemon time " in proof
    assert re.search(r"^ proofs 1 completed, 0 failed \(concurrency 1, 1 submissions\)$", report,
                     re.M), report  # fmt: skip
    assert re.search(r"^ rate +\d+\.\d proofs/hour in wall time \(1 in ", report, re.M), report
    assert re.search(r"^ +\d+\.\d proofs/hour in daemon time \(", report, re.M), report
    assert shown[-1].startswith(" exit   0 (ok) after "), report
    assert '"event"' not in raw  # no JSON lines for a person
    assert "summary:" not in raw  # nor the plain lines: the view says it


@pytest.mark.slow
def test_on_a_terminal_a_daemon_that_never_answers_is_an_error_line_and_exit_3(c1_file):
    address = f"127.0.0.1:{free_port()}"
    argv = ["prove", "--addr", address, "--c1-file", str(c1_file), "--ready-deadline-s", "1"]
    rc, raw = run_on_a_terminal([sys.executable, "-m", "cuzk_supervisor", *argv], 60)
    shown = [line for line in emulate(raw) if line.strip()]
    report = "\n".join(shown)
    assert rc == 3, report
    (error,) = [line for line in shown if line.startswith("   ✗ ")]
    assert f"daemon at {address} not ready after " in error
    assert shown[-1].startswith(" exit   3 (daemon failed to start) after "), report
    assert "Traceback" not in raw
    assert '"event"' not in raw


# --- the pure parts ---------------------------------------------------------------------------


def result(start: float, landed: float, end: float, total_ms: int, ok: bool = True) -> ProofResult:
    return ProofResult(
        job_id=f"job-{start}",
        status=ProofStatus.COMPLETED if ok else ProofStatus.FAILED,
        started_at=start,
        finished_at=end,
        timings=DaemonTimings(total_ms=total_ms),
        landed_at=landed,
    )


def test_daemon_time_is_measured_from_the_daemons_own_total_ms():
    # Two proofs, each 3.6 s of wall time after landing and 360 s of daemon time: x100.
    results = [result(0.0, 0.1, 3.7, 360_000), result(3.7, 3.8, 7.4, 360_000)]
    batch_wall = 7.4
    measured = provereport.daemon_time(results, batch_wall)
    assert measured is not None
    assert measured.seconds_per_second == pytest.approx(100.0)
    assert measured.wall_s == pytest.approx(740.0)
    assert measured.proofs_per_hour == pytest.approx(2 / 740.0 * 3600)


def test_daemon_time_leaves_failed_proofs_out_and_is_none_without_figures():
    failed = result(0.0, 0.1, 1.1, 999_000, ok=False)
    assert provereport.daemon_time([failed], 1.1) is None
    assert provereport.daemon_time([result(0.0, 0.1, 1.1, 0)], 1.1) is None
    measured = provereport.daemon_time([failed, result(0.0, 0.0, 2.0, 4_000)], 2.0)
    assert measured is not None
    assert measured.seconds_per_second == pytest.approx(2.0)
    assert measured.proofs_per_hour == pytest.approx(1 / 4.0 * 3600)


def test_summary_line_gives_both_rates():
    results = (result(0.0, 0.0, 1.0, 100_000),)
    batch = BatchResult(results=results, summary=summarize_batch(results, 1))
    line = provereport.summary_line(batch, provereport.daemon_time(results, 1.0))
    assert "3600.00 proofs/hour;" in line
    assert "daemon time 100.0 s (x100.00), 36.00 proofs/hour in daemon time" in line


def test_partitions_from_the_daemons_status_document():
    document = {
        "synthesis": {"max_concurrent": 26, "active": 1},
        "pipelines": [
            {"job_id": "a", "partitions": [{"index": 0, "state": "done"}, {"state": "gpu"}]},
            {"job_id": "b", "partitions": []},
            "junk",
        ],
    }
    sample = parse_status(document, 0.0)
    assert sample is not None
    assert sample.partitions_by_job() == {"a": (1, 2)}
    assert parse_status({"pipelines": "no"}, 0.0) is None


async def test_the_live_line_reads_nothing_where_no_status_answers():
    # The daemon binds its status listener on TCP only: a unix path is no status at all.
    assert status_address("unix:///run/x.sock") is None
    assert await read_sample(status_address("unix:///run/x.sock"), 0.0) is None
    assert await read_sample(status_address(f"127.0.0.1:{free_port()}"), 0.0) is None


def test_progress_fields():
    tracker = proveprogress.Tracker(prover=None)  # type: ignore[arg-type]
    tracker.running = {"a": 10.0}
    tracker.completed = 1
    fields = proveprogress.progress_fields(
        now=75.0, started=0.0, count=3, tracker=tracker, partitions={"a": (4, 10), "z": (9, 9)}
    )
    assert fields == {
        "elapsed_s": 75.0,
        "count": 3,
        "done": 1,
        "failed": 0,
        "running": 1,
        "proof": 2,
        "proof_elapsed_s": 65.0,
        "partitions_done": 4,
        "partitions_total": 10,
        "eta_s": 150.0,
    }
    assert proveprogress.PROGRESS_INTERVAL_S <= 5.0  # docs/commands.md promises at least every 10 s


def test_the_partition_workers_come_from_the_daemons_config():
    rendered = {"synthesis": {"partition_workers": 12}, "pipeline": {"max_parallel_synthesis": 12}}
    assert provereport.config_workers(rendered) == 12
    assert provereport.config_workers({"pipeline": {"max_parallel_synthesis": 7}}) == 7
    assert provereport.config_workers({"synthesis": {"partition_workers": True}}) is None
    assert provereport.config_workers({}) is None


def test_where_the_partition_workers_come_from(tmp_path):
    config = tmp_path / "cuzk.toml"
    config.write_text("[synthesis]\npartition_workers = 7\n")
    s = settings.load(environ={"CUZK_SUPERVISOR_RUN_DIR": str(tmp_path / "run")}).settings

    def args(**given):
        values = {"partition_workers": None, "daemon_config": None, **given}
        return argparse.Namespace(**values)

    assert prove._partition_workers(args(partition_workers=3), s) == (3, "--partition-workers")
    assert prove._partition_workers(args(daemon_config=config), s) == (7, str(config))
    # Without a flag: the file run renders in run_dir; none there: not told, and said so.
    workers, source = prove._partition_workers(args(), s)
    assert workers is None
    assert source.startswith("not told (no ")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cuzk.toml").write_text("[pipeline]\nmax_parallel_synthesis = 9\n")
    assert prove._partition_workers(args(), s) == (9, str(tmp_path / "run" / "cuzk.toml"))
    with pytest.raises(UsageError, match="no such file"):
        prove._partition_workers(args(daemon_config=tmp_path / "missing.toml"), s)
