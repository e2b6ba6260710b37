"""Issue 2 acceptance: the proving client against the simulated daemon as a real process."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from datetime import datetime

import pytest
from pacehelpers import patient, scaled
from simhelpers import SimProcess, free_tcp_port, write_config

from cuzk_supervisor.adapters.proving.client import ProvingClient
from cuzk_supervisor.adapters.proving.errors import DaemonNotReady
from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
from cuzk_supervisor.adapters.proving.proofinput import build_submit_request, load_c1
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.sim.daemon.c1 import write_c1

pytestmark = pytest.mark.slow

SHORT = ProvingTimeouts(
    submit_deadline_s=0.3,
    await_deadline_s=0.2,
    call_deadline_s=0.3,
    backoff_base_s=0.05,
    backoff_max_s=0.3,
)
LONGEST_CALL_DEADLINE = max(SHORT.submit_deadline_s, SHORT.await_deadline_s, SHORT.call_deadline_s)


def sim_scale() -> float:
    """The sims' time scale: 100 on the reference machine, slower on a slow one (pacehelpers)."""
    return scaled(100.0)


def submissions(sim: SimProcess, request_id: str) -> int:
    pattern = rf'cuzk_sim_submissions_total\{{request_id="{re.escape(request_id)}"\}}\s+(\d+)'
    match = re.search(pattern, sim.metrics())
    return int(match.group(1)) if match else 0


def steady_rate(sim: SimProcess) -> float:
    match = re.search(r"^cuzk_sim_steady_state_proofs_per_hour\s+(\S+)$", sim.metrics(), re.M)
    assert match, "sim exposes its steady-state rate"
    return float(match.group(1))


@pytest.fixture
def c1(tmp_path):
    path = tmp_path / "c1.json"
    write_c1(path, size_bytes=300_000)
    return path


@pytest.fixture
def started(tmp_path):
    sims: list[SimProcess] = []

    def start(*faults: str, listen: str | None = None, workers: int = 2) -> SimProcess:
        config = write_config(
            tmp_path,
            synthesis={"partition_workers": workers},
            srs={"param_cache": str(tmp_path / "params")},
        )
        args = [arg for fault in faults for arg in ("--fault", fault)]
        sim = SimProcess.start(
            listen=listen or f"127.0.0.1:{free_tcp_port()}",
            config=config,
            args=args,
            time_scale=sim_scale(),
        )
        sims.append(sim)
        return sim

    yield start
    for sim in sims:
        sim.kill()


async def test_first_proof_ten_times_longer_than_any_deadline_completes_with_one_submission(
    started, c1
):
    sim = started()
    request = build_submit_request(load_c1(c1), request_id="first-proof")
    async with ProvingClient(parse_address(sim.listen), SHORT) as client:
        result = await client.prove(request, budget_s=patient(60))
    assert result.ok, result.error
    # The first proof (no PCE yet) outlived every single call's deadline many times over.
    assert result.wall_s > 10 * LONGEST_CALL_DEADLINE  # a lower bound: slow only adds
    assert result.await_attempts >= 10
    assert submissions(sim, "first-proof") == 1


async def test_three_dropped_connections_during_one_proof(started, c1):
    sim = started("drop,times=3")
    request = build_submit_request(load_c1(c1), request_id="dropped")
    async with ProvingClient(parse_address(sim.listen), SHORT) as client:
        result = await client.prove(request, budget_s=patient(60))
    assert result.ok, result.error
    assert len([ln for ln in sim.lines if "sim fault firing" in ln and "drop" in ln]) == 3
    assert submissions(sim, "dropped") == 1


async def test_sim_restart_mid_proof_resubmits_once_with_same_id(started, c1):
    listen = f"127.0.0.1:{free_tcp_port()}"
    first = started(listen=listen)
    request = build_submit_request(load_c1(c1), request_id="survives-restart")
    async with ProvingClient(parse_address(listen), SHORT) as client:
        proof = asyncio.create_task(client.prove(request, budget_s=patient(90)))
        await asyncio.to_thread(first.wait_for_line, r"proof submitted job_id=survives-restart")
        first.kill()
        second = started(listen=listen)
        result = await proof
    assert result.ok, result.error
    assert result.submissions == 2
    assert submissions(second, "survives-restart") == 1


async def test_wait_ready_with_nothing_listening_names_the_address():
    address = parse_address(f"127.0.0.1:{free_tcp_port()}")
    timeouts = ProvingTimeouts(ready_poll_interval_s=0.25, ready_poll_max_s=0.5)
    async with ProvingClient(address, timeouts) as client:
        with pytest.raises(DaemonNotReady) as caught:
            await client.wait_ready(deadline_s=2.0)
    assert str(address) in str(caught.value)
    # It stopped polling at its deadline (an ignored one would poll on until the test's timeout).
    assert caught.value.calls <= 2.0 / 0.25 + 1


async def test_sixty_megabyte_input_accepted_end_to_end(started, tmp_path):
    sim = started()
    big = tmp_path / "c1-60mb.json"
    write_c1(big, size_bytes=61 * 1024 * 1024)
    request = build_submit_request(load_c1(big), request_id="big-input")
    assert request.ByteSize() >= 60 * 1024 * 1024
    # The upload gets the product's own submit deadline, set for inputs this size (SHORT's
    # 0.3 s is for the small ones: on a slow machine 60 MB never landed within it).
    timeouts = dataclasses.replace(SHORT, submit_deadline_s=ProvingTimeouts().submit_deadline_s)
    async with ProvingClient(parse_address(sim.listen), timeouts) as client:
        result = await client.prove(request, budget_s=patient(90))
    assert result.ok, result.error
    assert result.proof_len == 1920
    assert submissions(sim, "big-input") == 1


async def test_failed_proof_returns_the_daemons_message_after_one_attempt(started, c1):
    sim = started("fail:GPU fell off the bus")
    request = build_submit_request(load_c1(c1), request_id="doomed")
    async with ProvingClient(parse_address(sim.listen), SHORT) as client:
        result = await client.prove(request, budget_s=patient(60))
    assert not result.ok
    assert "GPU fell off the bus" in result.error
    assert result.submissions == 1
    assert submissions(sim, "doomed") == 1


def prove_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cuzk_supervisor", "prove", *args]


def prove_env(**settings: str) -> dict[str, str]:
    """The environment with no supervisor settings of the host's, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_SUPERVISOR_")}
    return {**env, **{f"CUZK_SUPERVISOR_{k.upper()}": v for k, v in settings.items()}}


def json_events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def stamp(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def test_prove_batch_rate_within_two_percent_of_the_sims_steady_state(started, c1):
    sim = started()
    base = prove_argv("--addr", sim.listen, "--c1-file", str(c1))
    # The first proofs after a start are slow (no PCE, cold start): warm up outside the batch.
    subprocess.run(
        [*base, "--count", "2"],
        env=prove_env(),
        check=True,
        capture_output=True,
        timeout=patient(60),
    )
    out = subprocess.run(
        [*base, "--count", "6", "--concurrency", "2", "--await-deadline-s", "0.5", "--json"],
        env=prove_env(), check=True, capture_output=True, text=True, timeout=patient(120),
    )  # fmt: skip
    summary = json.loads(out.stdout)
    assert summary["completed"] == 6
    # The sim's clock runs time_scale (sim_scale()) times faster than the wall clock.
    measured = summary["proofs_per_hour"] / sim_scale()
    expected = steady_rate(sim)
    assert measured == pytest.approx(expected, rel=0.02)
    # prove measures that scale itself, from the daemon's own total_ms against the wall time from
    # each submit's answer to its result. The daemon took the job before it answered, so that
    # wall time can be short by the submit's answer lag, which is the machine's (a loaded one
    # measured +2.1 % here): the scale is held to what the proofs' own times allow, not to a
    # margin. From each submit's start to its result the daemon's work fits whole, so the true
    # scale is at least total / wall_s; the one margin left is the lag of hearing a result
    # (a result heard late reads a lower scale), 2 % of a proof's wall time.
    scale = summary["daemon_seconds_per_second"]
    proofs = summary["proofs"]
    floor = sum(p["total_ms"] for p in proofs) / 1000 / sum(p["wall_s"] for p in proofs)
    assert floor <= sim_scale() * 1.001, (floor, sim_scale())
    assert scale >= floor
    assert scale >= sim_scale() * 0.98
    # The rate in daemon time is the wall rate in that measured scale.
    assert summary["daemon_proofs_per_hour"] == pytest.approx(
        summary["proofs_per_hour"] / scale, rel=1e-3
    )


def test_prove_against_a_closed_port_exits_3_naming_the_address(c1):
    address = f"127.0.0.1:{free_tcp_port()}"
    # The timeout is a hang guard, not a speed check.
    out = subprocess.run(
        prove_argv("--addr", address, "--c1-file", str(c1), "--ready-deadline-s", "2"),
        env=prove_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("cuzk-supervisor prove:")]
    assert len(errors) == 1, out.stderr
    assert errors[0].startswith("cuzk-supervisor prove: error: ")
    assert address in errors[0]


def test_prove_against_a_slow_proof_reports_progress_at_least_every_ten_seconds(tmp_path, c1):
    # A first proof at time scale 25: about 360 daemon seconds, 14 s of wall time, during which
    # the daemon says nothing. prove says something at least every 10 s (the timestamps of its
    # own events), with the partitions the daemon's HTTP status lists, and measures the scale.
    status_listen = f"127.0.0.1:{free_tcp_port()}"
    config = write_config(
        tmp_path,
        synthesis={"partition_workers": 2},
        srs={"param_cache": str(tmp_path / "params")},
        daemon={"status_listen": status_listen},
    )
    sim = SimProcess.start(listen=f"127.0.0.1:{free_tcp_port()}", config=config, time_scale=25)
    try:
        # Everything from the environment: the C1 file, the daemon's address and its status.
        env = prove_env(
            c1_file=str(c1), daemon_listen=sim.listen, daemon_status_listen=status_listen
        )
        # The partition workers for the verdict: from the daemon's own config file.
        out = subprocess.run(
            prove_argv("--json", "--daemon-config", str(config)), env=env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        sim.kill()
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["completed"] == 1
    assert summary["wall_s"] > 10  # slow enough for the check to mean something (a lower bound)
    events = json_events(out.stderr)
    names = [e["event"] for e in events]
    assert names[0] == "prove.started"
    assert names[-1] == "prove.summary"
    progress = [e for e in events if e["event"] == "prove.progress"]
    assert len(progress) >= 2
    stamps = [stamp(e) for e in events]
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    # The promise itself, not a margin on it: prove says something at least every 10 s; it
    # writes every 5 s (proveprogress.PROGRESS_INTERVAL_S), so a timer 5 s late still keeps it.
    assert max(gaps) <= 10.0, list(zip(names[1:], gaps, strict=True))
    assert all(p["running"] == 1 and p["proof"] == 1 for p in progress)
    known = [p for p in progress if "partitions_total" in p]
    assert known, progress
    assert all(p["partitions_total"] == 10 for p in known)
    done = [p["partitions_done"] for p in known]
    assert done == sorted(done)
    assert summary["daemon_seconds_per_second"] == pytest.approx(25.0, rel=0.05)
    assert summary["daemon_proofs_per_hour"] == pytest.approx(
        3600 / (summary["proofs"][0]["total_ms"] / 1000), rel=0.05
    )
    # What bounded it, from the status sampled every 0.5 s (issue 25): one proof in flight on
    # 2 partition workers leaves the GPU workers waiting: not GPU-bound, and said with figures.
    bound = summary["bound"]
    assert bound["evidence"]["samples"] >= 8, bound
    assert bound["evidence"]["partition_workers"] == 2
    assert bound["evidence"]["workers_source"] == str(config)
    assert bound["bound"] in {"synthesis-bound", "feed-bound"}, bound
    assert next(e for e in events if e["event"] == "prove.summary")["bound"] == bound


def test_bad_input_is_a_one_line_error_with_exit_2(tmp_path):
    bad = tmp_path / "c1.json"
    bad.write_text("not json")
    cases = [
        ["--addr", "127.0.0.1:1", "--c1-file", str(bad)],
        ["--addr", "127.0.0.1:1", "--c1-file", str(tmp_path / "missing.json")],
        ["--addr", "localhost:1", "--c1-file", str(bad)],
        ["--addr", "127.0.0.1:1", "--c1-file", str(bad), "--kind", "nonsense"],
    ]
    for args in cases:
        out = subprocess.run(
            prove_argv(*args), env=prove_env(), capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr
