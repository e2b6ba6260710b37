"""An operator kills the instance from the dashboard (``POST /api/kill``), in each long phase:
the supervisor finds out from ``GET /status`` within one status interval, stops the daemon,
exits with the "instance gone" code, and sends no report that would revive the record."""

from __future__ import annotations

import pytest
from daemonhelpers import processes_mentioning
from lifecyclehelpers import lifecycle_env, start_run
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

STATUS_INTERVAL_S = 0.5
REPORTS = ("/param-done", "/bench-done", "/running")


@pytest.mark.parametrize("phase", ["warmup", "settle", "bench", "run"])
def test_a_kill_from_the_dashboard_ends_the_instance_within_one_status_interval(
    tmp_path, manager, phase
):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, status_interval_s=STATUS_INTERVAL_S, bench_count=12,
                        time_scale=50)  # fmt: skip
    run = start_run(env)
    try:
        poll_until(lambda: phase in run.phases() or run.proc.poll() is not None, 90,
                   what=f"phase {phase}")  # fmt: skip
        assert run.proc.poll() is None, f"ended before {phase}"
        uuid = run.named("manager.registered")[0]["uuid"]
        last_seq = max(r["seq"] for r in mgr.requests())
        answer = mgr.api_kill(uuid=uuid)
        assert answer.status_code == 200, answer.text
        # One status interval, the lookup and the daemon's stop grace.
        code = run.wait(STATUS_INTERVAL_S + 2 + 3)
    finally:
        run.kill()
    assert code == exitcodes.INSTANCE_GONE
    (gone,) = run.named("manager.instance_gone")
    assert "manually killed via UI" in gone["reason"]
    after = [r for r in mgr.requests(since=last_seq) if r["path"] in REPORTS]
    assert after == [], after
    record = mgr.instance(uuid)
    assert record is not None
    assert record["state"] == "killed"
    assert processes_mentioning(str(tmp_path / "run")) == []
    logs = mgr.logs(uuid, source="setup")
    assert any("instance gone" in line["text"] for line in logs)
