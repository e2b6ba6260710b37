"""The run phase's health watch end to end (issue 34): a whole lifecycle against the simulated
manager and daemon, production-like demand in the run phase (``sim.demand``), the fake NVML
over the GPUs' condition. The faults, one row each, are in the fault matrix
(``tests/faults/test_fault_matrix.py``, ``run-phase-*``); here: a day of bursts and idle hours
with no fault is healthy throughout and costs the manager nothing more, the ladder capped at
"say" never tells, and the probes show what the watch found."""

from __future__ import annotations

import signal

import httpx
import pytest
from healthruns import run_phase_env, setup_lines
from lifecyclehelpers import start_run
from prometheus_client.parser import text_string_to_metric_families
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

DAY = "busy:2h@2,idle:5h,busy:1h@1,idle:4h,busy:3h@2,idle:9h"
"""24 hours of the daemon's time: three bursts, 18 idle hours."""
DAY_SCALE = 1500.0
"""A day in about a minute."""


def metric(health_listen: str, name: str, **labels: str) -> float:
    text = httpx.get(f"http://{health_listen}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name}{labels} not in /metrics")


@pytest.mark.timeout(300)
def test_a_day_of_bursts_and_idle_hours_is_healthy_and_costs_the_manager_nothing(tmp_path, manager):
    mgr = manager()
    env = run_phase_env(
        tmp_path, mgr.url, pattern=DAY, time_scale=DAY_SCALE,
        # The watch as deployed, its thresholds in the day's scaled time (30 s is 20 ms here:
        # never below what the loaded test machine can tell apart).
        health_interval_s=0.2, health_gpu_lost_s=0.5, health_failing_s=1.0,
        health_stuck_min_s=1.0, health_throttle_s=2.4,
    )  # fmt: skip
    run = start_run(env)
    try:
        run.wait_event("health.watching", 60)
        start = max(r["seq"] for r in mgr.requests())
        uuid = run.named("manager.registered")[0]["uuid"]

        def demand_lines() -> list[str]:
            return [str(e.get("line")) for e in run.named("child.line")
                    if e.get("source") == "curio"]  # fmt: skip

        # The day is over when the demand begins its second cycle.
        poll_until(lambda: any("cycle 2" in line for line in demand_lines()), 200,
                   what="a day of demand")  # fmt: skip
        listen = env["CUZK_SUPERVISOR_HEALTH_LISTEN"]
        assert metric(listen, "cuzk_supervisor_health_level") == 0
        ready = httpx.get(f"http://{listen}/readyz", timeout=5)
        assert ready.status_code == 200
        assert "health" not in ready.json()
        run.signal(signal.SIGTERM)
        code = run.wait(30)
    finally:
        run.kill()
    assert code == 128 + signal.SIGTERM
    lines = demand_lines()
    assert sum("completed in" in line for line in lines) >= 10
    assert sum("idle for" in line for line in lines) == 3
    # The manager heard only what any run phase sends: pings and log lines, one verdict.
    paths = {r["path"] for r in mgr.requests(since=start)}
    assert paths <= {"/running", "/api/log-push"}, paths
    assert len(mgr.requests(path="/bench-done")) == 1
    # Nothing beyond healthy: no finding said, no restart, nobody told.
    said = [e for e in run.events if str(e.get("event", "")).startswith("health.")]
    assert [e["event"] for e in said] == ["health.listening", "health.watching"]
    texts = [line["text"] for line in setup_lines(mgr, uuid)]
    assert [t for t in texts if t.startswith("health:") or "health.changed" in t] == []
    assert mgr.instances()[0]["state"] == "running"


def test_a_ladder_capped_at_say_tells_nobody(tmp_path, manager):
    mgr = manager()
    env = run_phase_env(tmp_path, mgr.url, faults=("gpu-lost:0,after_proofs=10",),
                        health_ladder="say")  # fmt: skip
    run = start_run(env)
    try:
        said = poll_until(
            lambda: [e for e in run.named("health.changed") if "not told" in e["reason"]],
            90,
            what="broken said, not told",
        )
        listen = env["CUZK_SUPERVISOR_HEALTH_LISTEN"]
        assert metric(listen, "cuzk_supervisor_health_level") == 2
        assert metric(listen, "cuzk_supervisor_health_finding", kind="gpu-lost") == 1
        ready = httpx.get(f"http://{listen}/readyz", timeout=5)
        assert ready.status_code == 503
        assert "fell off the bus" in ready.json()["health"]["reason"]
        run.signal(signal.SIGTERM)
        code = run.wait(30)
    finally:
        run.kill()
    assert code == 128 + signal.SIGTERM
    assert "the ladder stops before telling the manager" in said[0]["reason"]
    assert not run.named("health.telling_manager")
    assert len(mgr.requests(path="/bench-done")) == 1
    assert mgr.instances()[0]["state"] == "running"


def test_a_told_verdict_stands_across_a_restart_of_the_container(tmp_path, manager):
    mgr = manager()
    env = run_phase_env(tmp_path, mgr.url, faults=("gpu-lost:0,after_proofs=10",))
    first = start_run(env)
    try:
        assert first.wait(90) == exitcodes.HEALTH_BROKEN
    finally:
        first.kill()
    env["CUZK_SUPERVISOR_EXIT_AFTER_RUN"] = "true"
    second = start_run(env)
    try:
        assert second.wait(30) == exitcodes.HEALTH_BROKEN
    finally:
        second.kill()
    (finished,) = second.named("lifecycle.finished")
    assert "fell off the bus" in finished["reason"]
    assert not second.named("manager.registered")  # nothing registered again
