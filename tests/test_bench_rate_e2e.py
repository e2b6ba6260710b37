"""The reported rate under ordinary disturbances (issue: the rate decides whether a machine
lives): each run reports within 2% of the simulator's steady rate of the plan it ended on, a
fixed band: never widened by the error the product states nor by how late it was (issue 42: a
loaded machine, a reset connection must not reach the number).

The supervisor and the simulated daemon and manager run as real processes in scaled time. The
truth is the simulator's own pipeline model (``sim.daemon.pipeline``): the long-run rate of the plan
the run ended on, at the bench's concurrency.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest
from daemonhelpers import Supervisor
from lifecyclehelpers import fake_cgroup, lifecycle_env, reports, start_run
from pacehelpers import patient, scaled
from simhelpers import free_tcp_port, poll_until

from cuzk_supervisor import exitcodes
from cuzk_supervisor.sim.daemon.pipeline import simulate_closed_loop

pytestmark = pytest.mark.slow


def time_scale() -> float:
    """100 on the reference machine, slower on a slow or busy one (pacehelpers)."""
    return scaled(100.0)


SIM_GPU_WORKERS = 2  # one simulated GPU, two GPU workers per device (the sim's default)


def steady_rate(workers: int, concurrency: int = 2) -> float:
    """Proofs per hour of the model's pipeline once it is full (no fill, no drain)."""
    done = simulate_closed_loop(workers, SIM_GPU_WORKERS, concurrency, 500)
    return (len(done) - 100) / (done[-1] - done[99]) * 3600


def finish(run: Supervisor, timeout: float = 120) -> int:
    try:
        return run.wait(timeout)
    finally:
        run.kill()


def reported(run: Supervisor, mgr: Any) -> tuple[float, dict[str, Any]]:
    """The rate the manager received and the supervisor's account of how it was measured."""
    (bench,) = reports(mgr, "/bench-done")
    (result,) = run.named("bench.result")
    assert bench["json"]["rate"] == pytest.approx(result["rate"], rel=1e-3)
    return float(bench["json"]["rate"]), result


def assert_within_2_percent(rate: float, result: dict[str, Any]) -> None:
    truth = steady_rate(result["workers"], result["measurement"]["concurrency"])
    error = (rate - truth) / truth
    assert abs(error) <= 0.02, f"rate {rate:.2f} vs steady {truth:.2f} ({error:+.2%}): {result}"


def env_for(tmp_path: Any, mgr: Any, **settings: Any) -> dict[str, str]:
    # The warmup at 2 workers, then the restart at 5, as the scenarios below are told.
    defaults: dict[str, Any] = {
        "workers": 5, "warmup_workers": 2, "bench_count": 12, "exit_after_run": "true"
    }  # fmt: skip
    return lifecycle_env(tmp_path, mgr.url, time_scale=time_scale(), **{**defaults, **settings})


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_manager_away_through_params_does_not_hold_the_warmup_or_bend_the_rate(tmp_path, manager):
    mgr = manager()
    run = start_run(env_for(tmp_path, mgr, fetch_rate_mb=4))
    poll_until(lambda: "params" in run.phases() or run.proc.poll() is not None, 30, what="params")
    # The whole params phase and into the warmup (longer on a slow machine, whose params and
    # plan take longer too).
    mgr.faults(refuse_for=patient(4.0))
    assert finish(run) == exitcodes.OK
    (warmup,) = [e for e in run.named("phase.entered") if e["phase"] == "warmup"]
    (param_done,) = reports(mgr, "/param-done")
    # The warmup did not wait for the manager: it began before the manager, back, had the
    # params' report (an ordering, however slow the machine).
    assert stamp(warmup) < param_done["ts"]
    assert run.named("manager.away"), "the manager was not away"
    # Each report once; /running twice: the check before /bench-done and the run phase's report.
    for path, times in (("/param-done", 1), ("/bench-done", 1), ("/running", 2)):
        assert len(reports(mgr, path)) == times, path
    order = [r["path"] for r in reports(mgr, "/param-done") + reports(mgr, "/bench-done")]
    assert order == ["/param-done", "/bench-done"]
    (clock,) = run.named("bench.clock_started")
    assert clock["source"] in (
        "queued, acknowledged promptly",
        "acknowledged",
        "manager param_done_at",
    )
    rate, result = reported(run, mgr)
    assert_within_2_percent(rate, result)


def test_a_settle_proof_ten_times_slower_does_not_shrink_the_batch(tmp_path, manager):
    """Incident I3: the first proof after the restart is slow; the batch is sized from its own
    completions, not from that proof, and keeps its count and concurrency."""
    mgr = manager()
    marker = tmp_path / "first-start"
    sim = ("--first-proof-factor", "10", "--first-proof-factor-after", str(marker))
    run = start_run(env_for(tmp_path, mgr, sim_args=sim, bench_precision=0))  # the whole batch
    assert finish(run) == exitcodes.OK
    (settle,) = run.named("settle.done")
    (done,) = run.named("bench.stretch_done")
    assert done["completed"] == 12, done  # the 45-minute budget holds all 12 at 5 workers
    rate, result = reported(run, mgr)
    steady_s = 3600 / steady_rate(5) / time_scale()
    assert settle["wall_s"] > 5 * steady_s  # it really was slow (a lower bound: slow only adds)
    assert_within_2_percent(rate, result)


def test_a_daemon_crash_mid_bench_settles_and_measures_anew(tmp_path, manager):
    mgr = manager()
    # After the restart the daemon's 4th proof (settle + 3 bench proofs) ends with a crash, once.
    env = env_for(tmp_path, mgr, sim_faults=(f"exit:3,after_proofs=4,once={tmp_path}/m",))
    run = start_run(env)
    assert finish(run) == exitcodes.OK
    assert run.named("bench.interrupted")
    settles = [e for e in run.named("phase.entered") if e["phase"] == "settle"]
    assert len(settles) == 2  # settled again after the crash
    rate, result = reported(run, mgr)
    assert result["measurement"]["excluded"], result
    assert_within_2_percent(rate, result)


def test_a_budget_for_a_few_proofs_cuts_the_batch_at_full_concurrency(tmp_path, manager):
    mgr = manager()
    # A budget of 1200 simulated seconds (12 s at time scale 100): warmup (~3.6 s at 2
    # workers), restart and settle (~1.5 s) leave room for a few proofs (fewer where a loaded
    # machine makes those slower: the fill of 2 at least).
    budget_s = 1200 / time_scale()
    run = start_run(env_for(tmp_path, mgr, bench_budget_s=budget_s, bench_precision=0))
    assert finish(run) == exitcodes.OK
    rate, result = reported(run, mgr)
    (done,) = run.named("bench.stretch_done")
    assert 2 <= done["completed"] < 12, done
    assert "budget" in done["stopped"]
    how = result["measurement"]
    assert how["concurrency"] == 4  # bench_concurrency 2 and two queued ahead
    if done["completed"] >= 3:
        assert_within_2_percent(rate, result)
    else:
        assert not how["steady"], how  # marked short, with the reason
        assert "short" in how["reason"], how


def test_the_adaptive_stop_ends_a_steady_batch_early_and_says_why(tmp_path, manager):
    """Issue 25 item 5, issue 32: the record says why the batch stopped and how well it knows
    the rate, in bench.result, the state file and the benchout line. Whether a rate is known
    within 1 % is for bench/stop_stats.py to show over many seeded runs; here the precision
    asked for (±50 %) is one any run reaches at its floor of 8 completions, however loaded the
    machine, and no soak holds it, so the stop does not depend on the machine's speed."""
    mgr = manager()
    run = start_run(env_for(tmp_path, mgr, bench_precision=0.5, bench_min_soak_s=0,
                            bench_min_proofs=8))  # fmt: skip
    assert finish(run) == exitcodes.OK
    rate, result = reported(run, mgr)
    (done,) = run.named("bench.stretch_done")
    assert done["submitted"] < 12, done
    assert "precision" in done["stopped"], done
    how = result["measurement"]
    assert how["stopped"] == "precision", how
    assert how["precise"] is True, how
    assert how["uncertainty_pct"] <= 50, how
    assert how["proofs"] >= 8, how
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert state["bench"][-1]["measurement"]["stopped"] == "precision"
    uuid = run.named("manager.registered")[0]["uuid"]
    lines = mgr.get(f"/api/instance-logs/{uuid}", params={"source": "benchout"}).json()
    assert any("stopped: precision" in line["text"] for line in lines), lines
    assert_within_2_percent(rate, result)


def assert_no_small_piece(how: dict[str, Any]) -> None:
    """The rate comes from the whole stretch (nothing thrown away at a late hearing), or, where
    the machine moved, from its settled part; an imprecise one says so and what it would take."""
    assert how["proofs"] == how["stretch_proofs"] or how["drifted"], how
    assert how["precise"] is True or how["needed"] > how["proofs"], how
    if how["precise"] is False:
        assert "imprecise" in how["reason"], how


def test_connection_chaos_leaves_the_rate_whole(tmp_path, manager):
    """Issue 32, 42: the daemon's listener (TCP) resets every connection after a seeded pause of
    0.2-2 s throughout. A proof queued ahead keeps the daemon busy while we reconnect; the rate
    is the stretch's, not that of the few proofs after the last late one."""
    mgr = manager()
    sim = ("--chaos-resets", "0.2:2", "--chaos-seed", "3")
    run = start_run(
        env_for(tmp_path, mgr, sim_args=sim, daemon_listen=f"127.0.0.1:{free_tcp_port()}")
    )
    assert finish(run, timeout=240) == exitcodes.OK
    rate, result = reported(run, mgr)
    assert_no_small_piece(result["measurement"])
    assert_within_2_percent(rate, result)


def test_a_starved_cpu_leaves_the_rate_whole(tmp_path, manager):
    """Issue 32, 42: a busy loop on every core beside the whole lifecycle, at the supervisor's
    priority: the supervisor hears late and resubmits late; the proof queued ahead and the
    daemon's own timings keep the rate."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 1)]  # fmt: skip
    try:
        mgr = manager()
        run = start_run(env_for(tmp_path, mgr))
        assert finish(run, timeout=240) == exitcodes.OK
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(10)
    rate, result = reported(run, mgr)
    assert_no_small_piece(result["measurement"])
    assert_within_2_percent(rate, result)


def test_a_slow_machine_fits_its_batch_into_the_managers_budget(tmp_path, manager):
    mgr = manager()
    run = start_run(env_for(tmp_path, mgr, workers=2))
    assert finish(run) == exitcodes.OK
    rate, result = reported(run, mgr)
    (instance,) = mgr.instances()
    (param_done,) = reports(mgr, "/param-done")
    (bench_done,) = reports(mgr, "/bench-done")
    # The report reached the manager before its benchmark timeout (its clock).
    # Not a margin: the manager's own benchmark timeout (45 simulated minutes at the scale the
    # lifecycle ran at), which the batch must fit; a slow machine runs a slower scale.
    assert bench_done["ts"] - param_done["ts"] < 2700 / time_scale()
    assert instance["state"] == "running"
    assert_within_2_percent(rate, result)


def test_a_proactive_step_down_in_the_bench_reports_the_new_plans_rate(tmp_path, manager):
    mgr = manager()
    # The sim's memory.current: SRS + PCE 70 MiB, 15 MiB per active partition. A settle proof
    # at 20 workers has its 10 partitions active (220 MiB: 25% headroom, where a trend is not
    # yet trusted); the bench at concurrency 2 has 20 (370 MiB): over the limit, so the step
    # comes in the bench, to what fits. Those 20 are active together only while the first two
    # bench proofs synthesize (85 simulated s: 0.85 s here), which one sample a second can miss;
    # sampled every 0.05 s (the field's 1 s would be 0.01 s at this time scale) it cannot.
    folder = fake_cgroup(tmp_path / "cgroup", 295 * 2**20)
    env = env_for(tmp_path, mgr, workers=20, max_workers=20, bench_count=16, cgroup_root=folder,
                  memory_sample_interval_s=0.05, memory_alert_sample_interval_s=0.05,
                  memory_scale=1, sim_args=("--cgroup-dir", str(folder)))  # fmt: skip
    run = start_run(env)
    assert finish(run) == exitcodes.OK
    steps = run.named("plan.step_down")
    assert "bench" in [e["phase"] for e in steps], steps
    rate, result = reported(run, mgr)
    assert result["workers"] == steps[-1]["full_workers"]
    assert_within_2_percent(rate, result)


def test_sigterm_during_a_stretch_leaves_nothing_running(tmp_path, manager):
    mgr = manager()
    run = start_run(env_for(tmp_path, mgr))
    poll_until(lambda: run.named("bench.started") or run.proc.poll() is not None, 60,
               what="bench started")  # fmt: skip
    run.signal(signal.SIGTERM)
    assert finish(run) == 128 + signal.SIGTERM
