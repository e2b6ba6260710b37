"""Terminal verdicts stay terminal under a restart policy (Docker ``--restart always``,
Kubernetes ``restartPolicy: Always``): after a failed bench or a kill, a restarted supervisor
registers nothing, reruns no bench, reports the verdict again in its logs and stays up in the
``finished`` phase until it is stopped."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from daemonhelpers import Supervisor
from lifecyclehelpers import lifecycle_env, reports, start_run
from managerhelpers import ManagerProcess
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

RESTARTS = 2


def finished_or_exited(run: Supervisor) -> Callable[[], bool]:
    """A check for ``poll_until``: ``run`` said ``lifecycle.finished`` or exited. The event is
    logged just after the ``finished`` phase is entered, so waiting for the phase alone races
    the line that this check's callers read."""
    return lambda: bool(run.named("lifecycle.finished")) or run.proc.poll() is not None


def restart_like_always(env: dict[str, str], mgr: ManagerProcess) -> None:
    """What the restart policy does after each exit: start the same container again. Each
    restart must settle in ``finished``; it is then stopped as an operator would stop it."""
    for _ in range(RESTARTS):
        run = start_run(env)
        try:
            poll_until(finished_or_exited(run), 30, what="finished")
            assert run.proc.poll() is None, "a finished supervisor must stay up, not exit"
            assert run.phases() == ["finished"]
            (event,) = run.named("lifecycle.finished")
            assert event["reason"]
            run.signal(signal.SIGTERM)
            assert run.wait(15) == 128 + signal.SIGTERM
        finally:
            run.kill()


def test_a_failed_bench_is_not_rerun_by_a_restart_policy(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, min_rate=1e5, bench_count=3)
    first = start_run(env)
    try:
        assert first.wait(90) == exitcodes.BENCH_FAILED
    finally:
        first.kill()
    restart_like_always(env, mgr)
    assert len(reports(mgr, "/register")) == 1
    assert len(reports(mgr, "/bench-done")) == 1
    (instance,) = mgr.instances()
    assert instance["state"] == "killed"
    logs = mgr.logs(instance["uuid"], source="setup")
    assert sum("finished earlier" in line["text"] for line in logs) == RESTARTS


def test_a_killed_instance_does_not_register_again_after_a_restart(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, status_interval_s=0.5, bench_count=12)
    first = start_run(env)
    try:
        poll_until(lambda: "bench" in first.phases() or first.proc.poll() is not None, 60,
                   what="bench")  # fmt: skip
        uuid = first.named("manager.registered")[0]["uuid"]
        mgr.api_kill(uuid=uuid)
        assert first.wait(20) == exitcodes.INSTANCE_GONE
    finally:
        first.kill()
    restart_like_always(env, mgr)
    assert len(reports(mgr, "/register")) == 1
    assert reports(mgr, "/bench-done") == []
    assert [i["state"] for i in mgr.instances()] == ["killed"]
