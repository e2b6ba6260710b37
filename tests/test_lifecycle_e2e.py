"""Issue 5 acceptance: the whole lifecycle, real processes on loopback (sim manager, sim daemon)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from daemonhelpers import processes_mentioning
from lifecyclehelpers import fetch_runs, lifecycle_env, reports, start_run
from pacehelpers import scaled
from scripted import FULL_LOGS
from simhelpers import free_tcp_port, poll_until, quick_sim

from cuzk_supervisor import exitcodes
from cuzk_supervisor.sim.daemon import model

pytestmark = pytest.mark.slow

REPORT_PATHS = ("/register", "/param-done", "/bench-done", "/running")


def _finish(run, timeout=90):
    try:
        return run.wait(timeout)
    finally:
        run.kill()


def _report_order(mgr):
    order = [r["path"] for r in mgr.requests() if r["path"] in REPORT_PATHS]
    return [p for p in order if p in REPORT_PATHS]


def test_lifecycle_reports_each_phase_once_in_order_with_the_true_rate(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(
        tmp_path, mgr.url, time_scale=scaled(100), workers=5, warmup_workers=2, bench_count=12,
        exit_after_run="true", **FULL_LOGS,
    )  # fmt: skip
    run = start_run(env)
    assert _finish(run) == exitcodes.OK
    ok = sorted((r["seq"], path) for path in REPORT_PATHS for r in reports(mgr, path))
    # Each report once, in order; the /running before /bench-done is the check for a kill from
    # the dashboard (docs/manager.md).
    assert [path for _, path in ok] == [
        "/register",
        "/param-done",
        "/running",
        "/bench-done",
        "/running",
    ]
    (instance,) = mgr.instances()
    assert instance["state"] == "running"
    # 12 proofs at concurrency 2 on 5 workers: within 2% of the simulator's long-run rate.
    true_rate = model.steady_state_proofs_per_hour(5, 2, 2)
    assert instance["bench_rate"] == pytest.approx(true_rate, rel=0.02)
    logs = mgr.get(f"/api/instance-logs/{instance['uuid']}", params={"source": "setup"})
    texts = "\n".join(line["text"] for line in logs.json())
    for phase in ("register", "params", "plan", "warmup", "restart", "settle", "bench", "run"):
        assert f'"phase": "{phase}"' in texts or f"phase={phase}" in texts
    assert processes_mentioning(str(tmp_path / "run")) == []


def test_instance_logs_fill_the_dashboards_tabs(tmp_path, manager):
    """setup (our own lines), benchdaemon (the daemon until the bench is reported), benchout
    (bench progress and result), cuzk (the daemon after it); no tab-less "supervisor"."""
    mgr = manager()
    # The idle simulator is quiet: from its 5th proof (settle, 4 bench) it writes lines.
    env = lifecycle_env(tmp_path, mgr.url, bench_count=4, sim_faults=("flood:5,after_proofs=5",),
                        **FULL_LOGS)  # fmt: skip
    run = start_run(env)
    try:
        poll_until(lambda: "run" in run.phases() or run.proc.poll() is not None, 60, what="run")
        uuid = run.named("manager.registered")[0]["uuid"]

        def sources() -> set[str]:
            lines = mgr.get(f"/api/instance-logs/{uuid}", params={"tail": "10000"}).json()
            return {line["src"] for line in lines}

        poll_until(lambda: "cuzk" in sources(), 30, what="daemon lines under cuzk")
        found = sources()
        assert {"setup", "benchdaemon", "benchout", "cuzk"} <= found, found
        assert "supervisor" not in found
        bench = mgr.get(f"/api/instance-logs/{uuid}", params={"source": "benchout"}).json()
        assert any("bench result:" in line["text"] for line in bench)
    finally:
        run.signal(signal.SIGTERM)
        _finish(run)


def test_manager_away_then_flaky_each_report_arrives_exactly_once(tmp_path, manager):
    mgr = manager("--refuse-for", "4", "--fail-rate", "0.3", "--seed", "11")
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", manager_retry_s=300)
    run = start_run(env)
    assert _finish(run, timeout=120) == exitcodes.OK
    for path in REPORT_PATHS:
        # /running also checks for a kill before /bench-done (unchecked if not answered then).
        assert len(reports(mgr, path)) in ((1, 2) if path == "/running" else (1,)), path
    assert any(r.get("faulted") for r in mgr.requests())
    assert mgr.instances()[0]["state"] == "running"


def test_sigkill_mid_bench_then_restart_resumes_without_refetching(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", bench_count=12)
    first = start_run(env)
    try:
        poll_until(lambda: "bench" in first.phases(), 60, what="bench phase")
        uuid = first.named("manager.registered")[0]["uuid"]
        first.signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    second = start_run(env)
    assert _finish(second) == exitcodes.OK
    assert fetch_runs(tmp_path) == 1
    assert second.named("manager.registered")[0]["uuid"] == uuid
    assert "bench" in second.phases()
    assert len(reports(mgr, "/bench-done")) == 1
    assert len(reports(mgr, "/param-done")) >= 1
    assert processes_mentioning(str(tmp_path / "run")) == []


def test_rate_below_min_rate_stops_with_the_reason(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, min_rate=100000)
    run = start_run(env)
    assert _finish(run) == exitcodes.BENCH_FAILED
    (instance,) = mgr.status()
    assert instance["state"] == "killed"
    logs = mgr.get(f"/api/instance-logs/{instance['uuid']}").json()
    assert any("below min_rate" in line["text"] for line in logs)
    assert processes_mentioning(str(tmp_path / "run")) == []


def test_out_of_memory_even_at_one_worker_reports_rate_zero_with_the_reason(tmp_path, manager):
    mgr = manager()
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    env = lifecycle_env(
        tmp_path, mgr.url, workers=2,
        # SRS 44 GiB + one 15 GiB partition passes 50 GiB: out of memory at any worker count.
        sim_faults=("oom:50,times=0",), sim_args=("--cgroup-dir", str(cgroup)),
        cgroup_root=cgroup, memory_scale=1,
    )  # fmt: skip
    run = start_run(env)
    assert _finish(run, timeout=120) == exitcodes.OUT_OF_MEMORY
    steps = run.named("plan.step_down")
    assert steps
    assert steps[-1]["full_workers"] == 1
    (bench,) = reports(mgr, "/bench-done")
    assert bench["json"]["rate"] == 0
    (instance,) = mgr.status()
    logs = mgr.get(f"/api/instance-logs/{instance['uuid']}").json()
    assert any("out of memory" in line["text"] for line in logs)


def test_params_progress_shown_then_fetch_skipped_on_the_next_start(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, exit_after_run="true", fetch_rate_mb=4)
    first = start_run(env)
    assert _finish(first) == exitcodes.OK
    progress = first.named("params.progress")
    assert len(progress) >= 3
    assert progress[0]["done_bytes"] < progress[-1]["done_bytes"]
    second = start_run(env)
    assert _finish(second) == exitcodes.OK
    assert fetch_runs(tmp_path) == 1
    assert second.named("params.present")
    # The finished benchmark is not rerun either.
    assert "bench" not in second.phases()
    assert second.named("bench.already_reported")


def test_status_pings_in_each_phase_and_kill_stops_within_one_interval(tmp_path, manager):
    mgr = manager()
    env = lifecycle_env(
        tmp_path, mgr.url, status_interval_s=0.5, bench_count=12, running_ping_interval_s=1
    )
    run = start_run(env)
    try:
        poll_until(lambda: "run" in run.phases(), 90, what="run phase")
        poll_until(lambda: len(reports(mgr, "/running")) >= 3, 10, what="running pings")
        phases = {e["phase"] for e in run.named("supervisor.status")}
        assert {"warmup", "bench", "run"} <= phases
        uuid = run.named("manager.registered")[0]["uuid"]
        mgr.kill_instance(uuid, "operator says no")
        # The run phase's look-up is the ping (404 once killed): its interval and one status
        # tick, each jittered up to 20 % (issue 22), then the daemon's stop.
        code = run.wait(1.2 * (1 + 0.5) + 3.0)
    finally:
        run.kill()
    assert code == exitcodes.INSTANCE_GONE
    assert processes_mentioning(str(tmp_path / "run")) == []


def test_sim_command_completes_the_lifecycle(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "sim", "--sim-dir", str(tmp_path / "sim"),
         "--exit-after-run", "--log-format", "json",
         "--health-listen", f"127.0.0.1:{free_tcp_port()}", *quick_sim()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for phase in ("register", "params", "warmup", "bench", "report", "run"):
        assert f"phase {phase}" in out.stdout


def test_worker_commands_are_kept_up_in_the_run_phase(tmp_path, manager):
    mgr = manager()
    marker = tmp_path / "worker-runs"
    # One worker that stays up, one that dies at once every time (given up on, proving goes on).
    env = lifecycle_env(
        tmp_path, mgr.url,
        worker_commands=f"'echo started >> {marker}; echo worker-alive; sleep 600' 'exit 3'",
        crash_loop_failures=3, **FULL_LOGS,
    )  # fmt: skip
    run = start_run(env)
    try:
        given_up = poll_until(lambda: run.named("worker.crash_loop"), 60, what="worker1 given up")
        assert [e["worker"] for e in given_up] == ["worker1"]
        assert marker.read_text().splitlines() == ["started"]
        uuid = run.named("manager.registered")[0]["uuid"]
        poll_until(
            lambda: any(
                line["text"] == "worker-alive"
                for line in mgr.get(f"/api/instance-logs/{uuid}", params={"source": "curio"}).json()
            ),
            10,
            what="worker output shipped",
        )
        assert run.proc.poll() is None  # the instance keeps proving
        run.signal(signal.SIGTERM)
        assert run.wait(15) == 128 + signal.SIGTERM
    finally:
        run.kill()
    assert processes_mentioning(str(marker)) == []


def test_health_endpoints_follow_the_lifecycle(tmp_path, manager):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, bench_count=4)
    base = "http://" + env["CUZK_SUPERVISOR_HEALTH_LISTEN"]
    run = start_run(env)
    try:
        not_ready = poll_until(
            lambda: (r := httpx.get(f"{base}/readyz", timeout=2)).status_code == 503 and r, 30,
            what="readyz answering 503 before the run phase",
        )  # fmt: skip
        assert not_ready.json()["phase"] != "run"
        assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        ready = poll_until(
            lambda: (r := httpx.get(f"{base}/readyz", timeout=2)).status_code == 200 and r, 90,
            what="readyz 200 in the run phase",
        )  # fmt: skip
        assert ready.json() == {"phase": "run", "daemon_ready": True}
        families = {
            f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
        }
        phase = {s.labels["phase"]: s.value for s in families["cuzk_supervisor_phase"].samples}
        assert phase["run"] == 1
        completed = families["cuzk_supervisor_proofs_completed"].samples[0].value
        assert completed >= 4
        assert families["cuzk_supervisor_bench_rate_proofs_per_hour"].samples[0].value > 0
        run.signal(signal.SIGTERM)
        assert run.wait(15) == 128 + signal.SIGTERM
    finally:
        run.kill()
