"""The daemon as a supervised child, against the simulated daemon as a real process.

In-process (DaemonKeeper) where only the daemon's fate matters; the supervisor as a subprocess
(``cuzk-supervisor daemon``) where signals, exit codes and leftovers matter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime

import psutil
import pytest
from daemonhelpers import (
    Supervisor,
    absent,
    gone_or_zombie,
    processes_mentioning,
    sim_args,
    sim_settings,
    sim_values,
)
from pacehelpers import patient, slowness
from simhelpers import apoll_until, free_tcp_port, poll_until

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.proving.client import ProvingClient
from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
from cuzk_supervisor.adapters.proving.proofinput import build_submit_request, load_c1
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.core.exits import DaemonExit, ExitKind
from cuzk_supervisor.core.restart import RestartPolicy
from cuzk_supervisor.daemon.keeper import DaemonKeeper
from cuzk_supervisor.sim.daemon.c1 import write_c1

pytestmark = pytest.mark.slow

FAST_RESTARTS = RestartPolicy(initial_backoff_s=0.2, max_backoff_s=1.0, jitter=0.0)
CLIENT = ProvingTimeouts(await_deadline_s=0.5, backoff_base_s=0.05, backoff_max_s=0.3)


@pytest.fixture
def c1_request(tmp_path):
    path = tmp_path / "c1.json"
    write_c1(path, size_bytes=200_000)
    return build_submit_request(load_c1(path))


async def _proving(client: ProvingClient) -> bool:
    status = await client.status()
    return any(q.in_progress for q in status.queues)


async def _kill_while_proving(tmp_path, c1_request):
    settings = sim_settings(tmp_path)
    values = sim_values(tmp_path)
    keeper = DaemonKeeper(settings, values, FAST_RESTARTS)
    exits: list[DaemonExit] = []
    keeper.add_exit_listener(exits.append)
    run = asyncio.create_task(keeper.run())
    try:
        await asyncio.wait_for(keeper.wait_ready(), 30)
        assert keeper.current is not None
        first_pid = keeper.current.pid
        assert first_pid is not None
        async with ProvingClient(parse_address(values.listen), CLIENT) as client:
            proof = asyncio.create_task(client.prove(c1_request, budget_s=60))
            await apoll_until(lambda: _proving(client), 20, what="proof in progress")
            os.kill(first_pid, signal.SIGKILL)
            result = await proof
        return exits, result, keeper, first_pid
    finally:
        await keeper.stop()
        await run


async def test_sigkill_while_proving_is_killed_then_restarted_and_next_proof_succeeds(
    tmp_path, c1_request
):
    exits, result, keeper, first_pid = await _kill_while_proving(tmp_path, c1_request)
    assert exits[0].kind is ExitKind.KILLED
    assert exits[0].signal == signal.SIGKILL
    # The peak RSS of its tree while it ran (issue 14.7: always 0 before): a Python process with
    # grpc and the preloaded simulated SRS holds well over 20 MiB.
    assert exits[0].peak_rss_bytes > 20 * 2**20
    assert keeper.starts == 2
    assert keeper.current.pid != first_pid
    # The restarted daemon lost the job: the client resubmitted once, with the same id.
    assert result.ok, result.error
    assert result.submissions == 2


async def test_sim_oom_kill_with_counter_bump_is_classified_oom_killed(tmp_path, c1_request):
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    # As in a real cgroup, the counters exist (at 0) before anything was killed.
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    # SRS 44 GiB + 2 partitions x 15 GiB passes 60 GiB at the first proof.
    settings = sim_settings(
        tmp_path,
        cgroup_dir=cgroup,
        extra_args=sim_args(["oom:60"], extra=("--cgroup-dir", str(cgroup))),
    )
    values = sim_values(tmp_path)
    keeper = DaemonKeeper(settings, values, FAST_RESTARTS)
    exits: list[DaemonExit] = []
    keeper.add_exit_listener(exits.append)
    run = asyncio.create_task(keeper.run())
    try:
        await asyncio.wait_for(keeper.wait_ready(), 30)
        async with ProvingClient(parse_address(values.listen), CLIENT) as client:
            # The daemon may die before it answers the submit: its fate is not the point here.
            submit = asyncio.ensure_future(client.stub.SubmitProof(c1_request, timeout=10))
            await apoll_until(lambda: asyncio.sleep(0, exits), 20, what="daemon exit")
            await asyncio.gather(submit, return_exceptions=True)
        # Restarted after the backoff and answering again.
        await asyncio.wait_for(keeper.wait_ready(), 30)
    finally:
        await keeper.stop()
        await run
    assert exits[0].kind is ExitKind.OOM_KILLED
    assert exits[0].cgroup_oom_kills == 1
    assert keeper.starts == 2


def _daemon_cmd(tmp_path, *extra, faults=(), listen=None, binary=None, grace=3.0):
    args = [
        "--workers", "2",
        "--daemon-listen", listen or f"127.0.0.1:{free_tcp_port()}",
        "--daemon-status-listen", f"127.0.0.1:{free_tcp_port()}",
        "--daemon-param-cache", str(tmp_path / "params"),
        "--run-dir", str(tmp_path / "run"),
        "--log-dir", str(tmp_path / "run"),
        "--daemon-stop-grace-s", f"{grace:g}",
        "--daemon-startup-deadline-s", "20",
        "--restart-backoff-initial-s", "0.1",
        "--restart-backoff-max-s", "1",
        "--log-format", "json",
    ]  # fmt: skip
    if binary is None:
        args += ["--daemon-binary", sys.executable]
        args += [f"--daemon-args={shlex.join(sim_args(faults))}"]
    else:
        args += ["--daemon-binary", str(binary)]
    return [*args, *extra]


def test_crash_loop_backs_off_and_exits_with_the_verdict(tmp_path):
    sup = Supervisor(
        _daemon_cmd(tmp_path, "--crash-loop-failures", "4", "--crash-loop-window-s", "60",
                    faults=["exit:7"])
    )  # fmt: skip
    try:
        code = sup.wait(60)
    finally:
        sup.kill()
    assert code == exitcodes.DAEMON_CRASH_LOOP
    delays = [e["delay_s"] for e in sup.named("daemon.restart_scheduled")]
    # Policy: 0.1 s doubling, capped at 1 s, jitter shortening by at most 20%.
    assert len(delays) == 3
    for delay, base in zip(delays, (0.1, 0.2, 0.4), strict=True):
        assert base * 0.8 - 1e-3 <= delay <= base + 1e-3
    verdict = sup.named("daemon.crash_loop")[0]
    assert "4 failures" in verdict["verdict"]
    assert "code 7" in verdict["verdict"]
    assert any("crash loop" in line for line in sup.plain_lines)
    assert len(sup.named("daemon.spawned")) == 4


def _assert_start_failure(tmp_path, sup: Supervisor, expected: str) -> None:
    try:
        code = sup.wait(40)
    finally:
        sup.kill()
    assert code == exitcodes.DAEMON_FAILED_TO_START
    reason = [line for line in sup.plain_lines if line.startswith("cuzk-supervisor daemon:")]
    assert len(reason) == 1
    assert expected in reason[0]
    assert processes_mentioning(str(tmp_path)) == []


def test_missing_binary_fails_to_start_with_a_reason(tmp_path):
    sup = Supervisor(_daemon_cmd(tmp_path, binary=tmp_path / "no-such-cuzk"))
    _assert_start_failure(tmp_path, sup, "not found")


def test_binary_not_executable_fails_to_start_with_a_reason(tmp_path):
    binary = tmp_path / "cuzk"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o644)
    sup = Supervisor(_daemon_cmd(tmp_path, binary=binary))
    _assert_start_failure(tmp_path, sup, "not executable")


def test_address_in_use_fails_to_start_with_a_reason(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sup = Supervisor(_daemon_cmd(tmp_path, listen=f"127.0.0.1:{port}"))
        _assert_start_failure(tmp_path, sup, "address in use")


def test_address_in_use_reported_by_the_daemon_itself_is_permanent(tmp_path):
    sup = Supervisor(_daemon_cmd(tmp_path, faults=["addr-in-use"]))
    _assert_start_failure(tmp_path, sup, "address in use")
    assert len(sup.named("daemon.spawned")) == 1


def test_never_ready_fails_to_start_after_the_startup_deadline(tmp_path):
    args = _daemon_cmd(tmp_path, faults=["never-ready"])
    args[args.index("--daemon-startup-deadline-s") + 1] = "2"
    sup = Supervisor(args)
    _assert_start_failure(tmp_path, sup, "never ready within 2 s")


def _start_and_prove(tmp_path, faults=(), grace=3.0):
    listen = f"127.0.0.1:{free_tcp_port()}"
    sup = Supervisor(_daemon_cmd(tmp_path, faults=faults, listen=listen, grace=grace))
    sup.wait_event("daemon.ready")
    c1 = tmp_path / "c1.json"
    write_c1(c1, size_bytes=100_000)
    request = build_submit_request(load_c1(c1))

    async def submit_and_wait_in_progress() -> None:
        async with ProvingClient(parse_address(listen), CLIENT) as client:
            await client.stub.SubmitProof(request, timeout=10)
            await apoll_until(lambda: _proving(client), 20, what="proof in progress")

    asyncio.run(submit_and_wait_in_progress())
    return sup


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["cooperative", "ignores-sigterm"])
def test_sigterm_stops_daemon_and_descendants_within_grace(tmp_path, ignore_sigterm):
    grace = 1.5
    faults = ["ignore-sigterm"] if ignore_sigterm else []
    sup = _start_and_prove(tmp_path, faults, grace)
    try:
        daemon = sup.daemon_pid()
        tree = [daemon, *(c.pid for c in psutil.Process(daemon).children(True))]
        signalled = time.time()
        sup.signal(signal.SIGTERM)
        # A hang guard, not the grace: the kill at the grace is the supervisor's own timer,
        # checked below from its log.
        poll_until(lambda: all(gone_or_zombie(p) for p in tree), grace + 10, what="tree gone")
        code = sup.wait(10)
    finally:
        sup.kill()
    assert code == 128 + signal.SIGTERM
    expired = sup.named("daemon.stop_grace_expired")
    assert bool(expired) is ignore_sigterm  # SIGKILL only for a daemon that ignored SIGTERM
    for event in expired:  # ... and only once its grace was over (never early)
        assert event["grace_s"] == grace
        assert _unix(event) - signalled >= grace
    assert processes_mentioning(str(tmp_path)) == []
    # Each event once (issue 14.7): one exit of the daemon, its peak RSS filled in; the tree
    # stopped by the daemon's own stop is not reported again by the keeper's nor the last cleanup.
    (exited,) = sup.named("daemon.exited")
    assert exited["peak_rss_bytes"] > 20 * 2**20
    stopped = sup.named("pid1.tree_stopped") + sup.named("pid1.tree_killed")
    assert all(e.get("terminated") or e.get("killed") for e in stopped), stopped


def _unix(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def _grandchild_pid(log_path) -> int:
    for line in log_path.read_text().splitlines():
        if "forked a grandchild" in line:
            return int(line.split("pid=")[1].split()[0])
    raise AssertionError("no grandchild line yet")


def test_orphaned_grandchild_is_reaped_by_the_subreaper(tmp_path):
    sup = Supervisor(
        _daemon_cmd(tmp_path, "--restart-backoff-initial-s", "30", "--restart-backoff-max-s", "30",
                    faults=["fork-grandchild:0.5"])
    )  # fmt: skip
    try:
        sup.wait_event("daemon.restart_scheduled")
        grandchild = poll_until(
            lambda: _grandchild_pid(tmp_path / "run" / "cuzk.log"), 10, what="grandchild pid"
        )
        # It was re-parented to the supervisor (a subreaper), exited, and was reaped: no zombie.
        poll_until(lambda: absent(grandchild), 10, what="grandchild reaped")
        reaped = [e["pid"] for e in sup.named("pid1.orphan_reaped")]
        assert grandchild in reaped
        sup.signal(signal.SIGTERM)
        assert sup.wait(10) == 128 + signal.SIGTERM
    finally:
        sup.kill()


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="PID namespaces not permitted here (unshare)")
def test_orphaned_grandchild_is_reaped_by_the_supervisor_as_pid1(tmp_path):
    sup = Supervisor(
        _daemon_cmd(tmp_path, "--restart-backoff-initial-s", "30", "--restart-backoff-max-s", "30",
                    faults=["fork-grandchild:0.5"]),
        prefix=["unshare", "--pid", "--fork", "--mount-proc"],
    )  # fmt: skip
    try:
        started = sup.wait_event("supervisor.started")
        assert started["as_pid1"] is True
        sup.wait_event("daemon.restart_scheduled")
        reaped = poll_until(lambda: sup.named("pid1.orphan_reaped"), 10, what="orphan reaped")
        grandchild_ns_pid = _grandchild_pid(tmp_path / "run" / "cuzk.log")
        assert grandchild_ns_pid in [e["pid"] for e in reaped]
        # Seen from outside the namespace: nothing under unshare is a zombie.
        outside = psutil.Process(sup.proc.pid)
        zombies = [p.pid for p in outside.children(recursive=True) if p.status() == "zombie"]
        assert zombies == []
        # unshare does not pass signals on: signal the supervisor (PID 1 inside) directly.
        (inner,) = outside.children()
        inner.send_signal(signal.SIGTERM)
        assert sup.wait(10) == 128 + signal.SIGTERM
    finally:
        sup.kill()
    assert processes_mentioning(str(tmp_path)) == []


def test_stdout_flood_never_blocks_the_daemon_and_loses_no_line(tmp_path):
    listen = f"127.0.0.1:{free_tcp_port()}"
    # 50,000 lines a second on the reference machine, fewer on a slow one: the flood is the
    # daemon's own work too, and a machine that cannot write it falls behind in its own loop.
    rate = round(50_000 / slowness())
    sup = Supervisor(_daemon_cmd(tmp_path, faults=[f"flood:{rate}"], listen=listen))
    log_path = tmp_path / "run" / "cuzk.log"
    try:
        sup.wait_event("daemon.ready")
        supervisor_rss = []

        async def probe_while_flooding() -> int:
            # The daemon answers all along: its stdout never blocks it (a daemon blocked on a
            # full pipe answers nothing, and the generous deadline below runs out). How fast it
            # answers is the machine's, not asserted.
            answered = 0
            end = time.monotonic() + 2.0
            patient_client = dataclasses.replace(CLIENT, call_deadline_s=patient(30))
            async with ProvingClient(parse_address(listen), patient_client) as client:
                while time.monotonic() < end or answered < 2:
                    await client.status()
                    answered += 1
                    supervisor_rss.append(psutil.Process(sup.proc.pid).memory_info().rss)
            return answered

        asyncio.run(probe_while_flooding())
        sup.signal(signal.SIGTERM)
        assert sup.wait(20) == 128 + signal.SIGTERM
    finally:
        sup.kill()
    numbers = [
        int(line.rsplit("n=", 1)[1])
        for line in log_path.read_text().splitlines()
        if "sim log flood" in line
    ]
    assert len(numbers) > rate  # at least a second of the flood (it ran over two)
    # Every line the daemon wrote is in the file, whole and in order.
    assert numbers == list(range(len(numbers)))
    assert max(supervisor_rss) < 200 * 1024 * 1024
    suppressed = sum(e["lines"] for e in sup.named("child.output_suppressed"))
    assert suppressed > 0


def test_hung_daemon_is_killed_after_missed_liveness_probes_and_restarted(tmp_path):
    sup = Supervisor(
        _daemon_cmd(
            tmp_path,
            "--daemon-liveness-interval-s", "0.3",
            "--daemon-liveness-timeout-s", "0.3",
            "--daemon-liveness-failures", "2",
            faults=["hang,after_s=3"],  # after it is ready
        )
    )  # fmt: skip
    try:
        killed = sup.wait_event("daemon.unresponsive", timeout=30)
        exited = sup.wait_event("daemon.exited")
        assert exited["exit_kind"] == "killed"
        assert "unresponsive" in exited["exit_reason"]
        poll_until(lambda: len(sup.named("daemon.spawned")) >= 2, 20, what="restart")
        assert gone_or_zombie(killed["pid"])
        sup.signal(signal.SIGTERM)
        assert sup.wait(15) == 128 + signal.SIGTERM
    finally:
        sup.kill()


def test_a_daemon_left_running_without_a_pidfile_is_reclaimed(tmp_path):
    # A supervisor SIGKILLed between spawn and pidfile leaves a daemon holding the address,
    # known only by its --config argument.
    listen = f"127.0.0.1:{free_tcp_port()}"
    config = tmp_path / "run" / "cuzk.toml"
    config.parent.mkdir(parents=True)
    stale = subprocess.Popen(
        [sys.executable, *sim_args(), "--config", str(config), "--listen", listen],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    sup = Supervisor(_daemon_cmd(tmp_path, listen=listen))
    try:
        reclaimed = sup.wait_event("daemon.stale_reclaimed")
        assert stale.pid in reclaimed["pids"]
        sup.wait_event("daemon.ready")
        assert stale.wait(5) == -signal.SIGTERM
        sup.signal(signal.SIGTERM)
        assert sup.wait(15) == 128 + signal.SIGTERM
    finally:
        sup.kill()
        stale.kill()
