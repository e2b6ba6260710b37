"""Failures in the run phase end as values: the documented exit code, the reason in the
manager's instance logs, no traceback and no exception group."""

from __future__ import annotations

import os
import signal

import pytest
from lifecyclehelpers import fake_cgroup, lifecycle_env, start_run
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow


def assert_no_traceback(run) -> None:
    text = run.stderr_text()
    assert "Traceback" not in text
    assert "ExceptionGroup" not in text


def setup_logs(mgr, uuid: str) -> str:
    return "\n".join(line["text"] for line in mgr.logs(uuid, source="setup"))


def test_memory_trouble_at_one_worker_in_the_run_phase_is_out_of_memory(tmp_path, manager):
    mgr = manager()
    cgroup = fake_cgroup(tmp_path / "cgroup", 10 * 2**30)
    env = lifecycle_env(tmp_path, mgr.url, workers=1, bench_count=3, cgroup_root=cgroup,
                        memory_scale=1, sim_args=("--cgroup-dir", str(cgroup)))  # fmt: skip
    run = start_run(env)
    try:
        poll_until(lambda: "run" in run.phases() or run.proc.poll() is not None, 60, what="run")
        uuid = run.named("manager.registered")[0]["uuid"]
        # A neighbour in the same cgroup: the limit is now below what the daemon holds.
        current = int((cgroup / "memory.current").read_text())
        (cgroup / "memory.max").write_text(f"{current + 2**20}\n")
        code = run.wait(30)
    finally:
        run.kill()
    assert code == exitcodes.OUT_OF_MEMORY
    assert_no_traceback(run)
    assert "out of memory" in setup_logs(mgr, uuid)


def test_a_daemon_crash_loop_in_the_run_phase_is_its_documented_code(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, bench_count=3, crash_loop_failures=3,
                        crash_loop_window_s=60)  # fmt: skip
    run = start_run(env)
    try:
        poll_until(lambda: "run" in run.phases() or run.proc.poll() is not None, 60, what="run")
        uuid = run.named("manager.registered")[0]["uuid"]
        killed: set[int] = set()

        def kill_the_newest_daemon() -> bool:
            if run.proc.poll() is not None:
                return True
            pid = int(run.named("daemon.spawned")[-1]["pid"])
            if pid not in killed and run.named("daemon.ready") and len(killed) < 3:
                ready = [e for e in run.named("daemon.ready") if e.get("pid", pid) == pid]
                if ready:
                    killed.add(pid)
                    os.kill(pid, signal.SIGKILL)
            return False

        poll_until(kill_the_newest_daemon, 60, what="crash loop verdict")
        code = run.wait(10)
    finally:
        run.kill()
    assert code == exitcodes.DAEMON_CRASH_LOOP
    assert_no_traceback(run)
    assert "crash" in setup_logs(mgr, uuid)
