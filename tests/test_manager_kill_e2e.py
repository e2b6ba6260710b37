"""An operator kills the instance from the dashboard (``POST /api/kill``), in each long phase:
the supervisor finds out within the bound its phase has (docs/manager.md), stops the
daemon, exits with the "instance gone" code, and sends no report that would revive the record.

How it finds out depends on the phase (issue 22: nothing periodic reads the whole table unless
asked): in the run phase the repeated ``/running`` answers 404 once the record is killed; before
it, one ``/running`` just before ``/bench-done`` asks the same and, where
``manager_status_lookup_s`` asks, the whole table is read at that cadence."""

from __future__ import annotations

import pytest
from daemonhelpers import processes_mentioning
from lifecyclehelpers import lifecycle_env, start_run
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

STATUS_INTERVAL_S = 0.5
PING_INTERVAL_S = 1.0
REPORTS = ("/param-done", "/bench-done", "/running")


def kill_in(run, mgr, phase: str) -> tuple[str, int]:
    """Wait for ``phase``, kill the instance from the dashboard: (uuid, last request seen)."""
    poll_until(lambda: phase in run.phases() or run.proc.poll() is not None, 90,
               what=f"phase {phase}")  # fmt: skip
    assert run.proc.poll() is None, f"ended before {phase}"
    uuid = run.named("manager.registered")[0]["uuid"]
    last_seq = max(r["seq"] for r in mgr.requests())
    answer = mgr.api_kill(uuid=uuid)
    assert answer.status_code == 200, answer.text
    return uuid, last_seq


def assert_ended_by_the_kill(run, mgr, tmp_path, uuid: str, last_seq: int, code: int) -> None:
    assert code == exitcodes.INSTANCE_GONE
    (gone,) = run.named("manager.instance_gone")
    # In the run phase the ping's 404 is the evidence; the record, read once then, says why.
    assert "manually killed via UI" in gone["reason"]
    # Nothing applied after the kill: a /running answered 404 is how the run phase finds out.
    after = [r for r in mgr.requests(since=last_seq) if r["path"] in REPORTS]
    assert all(r["path"] == "/running" and r["status"] == 404 for r in after), after
    record = mgr.instance(uuid)
    assert record is not None
    assert record["state"] == "killed"
    assert processes_mentioning(str(tmp_path / "run")) == []
    logs = mgr.logs(uuid, source="setup")
    assert any("instance gone" in line["text"] for line in logs)


@pytest.mark.parametrize("phase", ["warmup", "settle", "bench", "run"])
def test_a_kill_from_the_dashboard_ends_the_instance_within_its_phase_bound(
    tmp_path, manager, phase
):
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, status_interval_s=STATUS_INTERVAL_S, bench_count=12,
                        time_scale=50, manager_status_lookup_s=STATUS_INTERVAL_S,
                        running_ping_interval_s=PING_INTERVAL_S)  # fmt: skip
    run = start_run(env)
    try:
        uuid, last_seq = kill_in(run, mgr, phase)
        # The look-up's interval (the ping's in the run phase) jittered up to 20 %, one status
        # tick, the look-up and the daemon's stop grace.
        interval = PING_INTERVAL_S if phase == "run" else STATUS_INTERVAL_S
        code = run.wait(1.2 * (interval + STATUS_INTERVAL_S) + 2 + 3)
    finally:
        run.kill()
    assert_ended_by_the_kill(run, mgr, tmp_path, uuid, last_seq, code)


def test_by_default_a_kill_before_the_run_phase_is_found_before_bench_done(tmp_path, manager):
    """With the defaults nothing reads the whole table periodically: a kill during the warmup is
    found by the one ``/running`` before ``/bench-done`` (the bound is the end of the bench), and
    no ``/bench-done`` revives the record."""
    mgr = manager()
    env = lifecycle_env(tmp_path, mgr.url, status_interval_s=STATUS_INTERVAL_S, bench_count=4,
                        time_scale=50)  # fmt: skip
    run = start_run(env)
    try:
        uuid, last_seq = kill_in(run, mgr, "warmup")
        code = run.wait(90)
    finally:
        run.kill()
    assert_ended_by_the_kill(run, mgr, tmp_path, uuid, last_seq, code)
    assert "report" in run.phases() or "bench" in run.phases()
    # The kill was found by the /running before /bench-done (404); the whole table was read to
    # say why (and for the bench clock after a slow acknowledgement), never at the status cadence.
    (probe,) = [r for r in mgr.requests(since=last_seq) if r["path"] == "/running"]
    assert probe["status"] == 404
    assert len(mgr.requests(path="/status")) <= 2
