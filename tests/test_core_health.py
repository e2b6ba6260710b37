"""The run phase's health policy as a pure function over recorded evidence (issue 34): status
documents in the real daemon's shape (``tests/healthdocs.py``), GetMetrics totals and NVML
readings, judged observation by observation."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from healthdocs import document, partition, pipeline, proving, worker

from cuzk_supervisor.core.health import (
    CRASH_LOOP,
    DAEMON_EXITS,
    ECC,
    GPU_LOST,
    PAGES_RETIRED,
    PROOFS_FAILING,
    STUCK,
    THROTTLED,
    Assessment,
    HealthState,
    Level,
    assess,
)
from cuzk_supervisor.core.healthevidence import (
    GpuView,
    Observation,
    ProofTotals,
    daemon_view,
    proof_totals,
)
from cuzk_supervisor.core.healthpolicy import HealthPolicy

POLICY = HealthPolicy(gpu_lost_s=60, failing_proofs=3, failing_s=900, stuck_factor=10,
                      stuck_min_s=120, throttle_ratio=0.5, throttle_s=3600, daemon_exits=3,
                      exit_window_s=3600)  # fmt: skip
IDLE_GPU = GpuView(0, utilisation=0.0, sm_clock_ratio=0.15)  # low clocks at rest: no reason


def run(observations: Iterable[Observation], policy: HealthPolicy = POLICY,
        state: HealthState | None = None) -> list[Assessment]:  # fmt: skip
    state = state or HealthState()
    out = []
    for obs in observations:
        state, assessment = assess(policy, state, obs)
        out.append(assessment)
    return out


def kinds(assessment: Assessment) -> dict[str, Level]:
    return {f.kind: f.level for f in assessment.findings}


def obs(at: float, doc: dict | None = None, *, totals: tuple[int, int] | None = None,
        gpus: tuple[GpuView, ...] | None = (IDLE_GPU,), starts: int = 1, exits: int = 0,
        crash_loop: str = "") -> Observation:  # fmt: skip
    return Observation(
        at=at,
        daemon=daemon_view(doc) if doc is not None else None,
        totals=ProofTotals(*totals) if totals is not None else None,
        gpus=gpus,
        daemon_starts=starts,
        daemon_exits=exits,
        crash_loop=crash_loop,
    )


# --- the readers -------------------------------------------------------------------------------


def test_daemon_view_reads_the_real_shape_and_scales_the_daemons_durations() -> None:
    doc = document(uptime=1000, completed=7, failed=1,
                   pipelines=[proving("j1", gpu_ms=4000)],
                   workers=[worker(0, 0, "j1", 4, busy_secs=4.0), worker(1, 0)])  # fmt: skip
    view = daemon_view(doc, time_scale=100)
    assert view is not None
    assert (view.uptime_s, view.completed, view.self_check_failures) == (10.0, 7, 1)
    in_gpu = [p for p in view.partitions if p.state == "gpu"]
    assert [(p.job_id, p.index, p.gpu_s) for p in in_gpu] == [("j1", 4, 0.04)]
    assert view.workers[0].proving
    assert view.workers[0].busy_s == pytest.approx(0.04)
    assert view.gpu_loaded(0)
    assert not view.gpu_loaded(1)
    assert len(view.in_flight()) == 6  # 1 in gpu, 5 synthesizing


def test_daemon_view_leaves_out_what_the_daemon_does_not_write() -> None:
    assert daemon_view({"synthesis": {}}) is None  # no counters: not the daemon's status
    assert daemon_view([1, 2]) is None
    job = pipeline("j", [partition(0, "failed")])
    job["partitions"].append("junk")  # what the daemon never writes
    doc = document(pipelines=[job])
    doc["pipelines"].append("junk")
    doc["gpu_workers"] = ["junk", {"worker_id": 3, "gpu_ordinal": -1, "busy_secs": True}]
    view = daemon_view(doc)
    assert view is not None
    assert view.failed_jobs == {"j"}
    assert view.in_flight() == ()
    assert view.workers[0].busy_s is None
    assert view.workers[0].gpu == 0


def test_proof_totals_from_the_daemons_metrics_text() -> None:
    text = ("# HELP cuzk_proofs_completed_total Total proofs completed\n"
            "cuzk_proofs_completed_total 12\ncuzk_proofs_failed_total 3\n"
            'cuzk_proofs_failed{proof_kind="porep_c2"} 3\n')  # fmt: skip
    assert proof_totals(text) == ProofTotals(12, 3)
    assert proof_totals("cuzk_proofs_completed_total 1\n") is None


# --- no demand is not trouble ------------------------------------------------------------------


def test_a_day_of_bursts_and_idle_hours_is_healthy_throughout() -> None:
    observations, t, done = [], 0.0, 0
    for hour in range(24):
        busy = hour % 6 < 2  # two busy hours, four idle ones
        for minute in range(0, 60, 2):
            t = hour * 3600 + minute * 60
            if busy:
                done += 1
                job = f"j{done}"
                doc = document(completed=done, pipelines=[proving(job)],
                               workers=[worker(0, 0, job, 4, 3.0), worker(1, 0)])  # fmt: skip
                gpu = GpuView(0, utilisation=0.9, sm_clock_ratio=0.95)
            else:
                doc, gpu = document(completed=done), IDLE_GPU
            observations.append(obs(t, doc, totals=(done, 0), gpus=(gpu,)))
    assert all(a.level is Level.HEALTHY for a in run(observations))


def test_idle_gpu_clocks_are_never_throttling() -> None:
    idle = GpuView(0, utilisation=0.0, sm_clock_ratio=0.1, slowdowns=("power-cap",))
    assessed = run(obs(t, document(), totals=(0, 0), gpus=(idle,)) for t in range(0, 20_000, 60))
    assert assessed[-1].level is Level.HEALTHY


def test_a_failed_jobs_partitions_left_in_gpu_are_not_stuck() -> None:
    # A GPU failure: the engine marks the job's later partitions GPU-started, skips them and
    # never ends them; the job is never completed, so it stays listed, its worker "proving".
    done = [partition(i, "done", 30_000, 3_000) for i in range(5)]
    leftover = pipeline("dead", done + [partition(i, "gpu", 30_000, 10**7) for i in range(5, 10)])
    doc = document(pipelines=[leftover], workers=[worker(0, 0, "dead", 9, 10_000.0)])
    before = obs(0, document(pipelines=[proving("dead")]), totals=(5, 0))
    after = [obs(t, doc, totals=(5, 1)) for t in (30, 3600, 7200)]
    assert all(a.level is Level.HEALTHY for a in run([before, *after]))


# --- proofs failing ----------------------------------------------------------------------------


def test_failing_proofs_are_degraded_then_broken_then_broken_for_good_after_a_restart() -> None:
    seq = [obs(0, document(), totals=(10, 0)), obs(60, document(), totals=(10, 2)),
           obs(120, document(), totals=(10, 3)), obs(1200, document(), totals=(10, 5))]  # fmt: skip
    assessed = run(seq)
    assert kinds(assessed[1]) == {}
    first = assessed[2].findings[0]
    assert (first.kind, first.level, first.restart_helps) == (PROOFS_FAILING, Level.DEGRADED, False)
    broken = assessed[3].findings[0]
    assert (broken.level, broken.restart_helps, broken.completed_since) == (Level.BROKEN, True, 0)
    # The daemon restarted (new start, totals from 0): three more failures, none completed.
    state = HealthState()
    for o in seq:
        state, _ = assess(POLICY, state, o)
    later = [obs(1300, document(uptime=5), totals=(0, 0), starts=2),
             obs(1400, document(uptime=100), totals=(0, 3), starts=2)]  # fmt: skip
    final = run(later, state=state)
    assert kinds(final[0]) == {}
    again = final[1].findings[0]
    assert (again.level, again.restart_helps) == (Level.BROKEN, False)
    assert "as before the daemon's restart" in again.reason


def test_a_completed_proof_ends_the_streak() -> None:
    seq = [obs(0, document(), totals=(0, 0)), obs(60, document(), totals=(0, 3)),
           obs(120, document(), totals=(1, 3)), obs(1200, document(), totals=(1, 4))]  # fmt: skip
    assessed = run(seq)
    assert PROOFS_FAILING in kinds(assessed[1])
    assert kinds(assessed[2]) == {}
    assert kinds(assessed[3]) == {}


def test_without_getmetrics_the_status_counters_count_self_check_failures() -> None:
    seq = [obs(t, document(completed=4, failed=f)) for t, f in ((0, 0), (60, 3))]
    assert kinds(run(seq)[1]) == {PROOFS_FAILING: Level.DEGRADED}


# --- GPUs ------------------------------------------------------------------------------------


def test_a_gpu_that_stops_answering_is_lost_after_the_grace_and_xid_79_at_once() -> None:
    gone = GpuView(0, answering=False, error="NVMLError_GpuIsLost: GPU is lost")
    assessed = run([obs(0, document()), obs(30, document(), gpus=(gone,)),
                    obs(100, document(), gpus=(gone,))])  # fmt: skip
    assert kinds(assessed[1]) == {GPU_LOST: Level.DEGRADED}
    lost = assessed[2].findings[0]
    assert (lost.level, lost.gpu, lost.restart_helps) == (Level.BROKEN, 0, False)
    assert "GpuIsLost" in lost.reason
    xid = run([obs(0, document(), gpus=(GpuView(1, xids=(79,)),))])[0]
    assert kinds(xid) == {GPU_LOST: Level.BROKEN}
    assert "XID 79" in xid.reason


def test_an_answer_from_the_gpu_again_clears_a_short_silence() -> None:
    gone = GpuView(0, answering=False, error="NVMLError_Unknown")
    assessed = run([obs(0, document(), gpus=(gone,)), obs(30, document())])
    assert kinds(assessed[1]) == {}


@pytest.mark.parametrize("xid", [48, 94, 95])
def test_uncorrectable_ecc_is_degraded_then_broken_in_a_second_daemon_life(xid: int) -> None:
    hit = GpuView(0, xids=(xid,), ecc_uncorrected=1)
    assessed = run([obs(0, document(), gpus=(GpuView(0, ecc_uncorrected=0),)),
                    obs(30, document(), gpus=(hit,)), obs(60, document()),
                    obs(90, document(uptime=5), starts=2),
                    obs(120, document(uptime=35), starts=2, gpus=(hit,))])  # fmt: skip
    first = assessed[1].findings[0]
    assert (first.kind, first.level, first.restart_helps) == (ECC, Level.DEGRADED, True)
    assert f"XID {xid}, 1 uncorrected ECC error" in first.reason
    assert kinds(assessed[3]) == {ECC: Level.DEGRADED}  # it stands (the card had one)
    final = assessed[4].findings[0]
    assert (final.level, final.restart_helps) == (Level.BROKEN, False)
    assert (final.since, final.latest, final.completed_since) == (30, 120, 0)


def test_a_rising_uncorrected_counter_alone_is_ecc() -> None:
    seq = [obs(0, document(), gpus=(GpuView(0, ecc_uncorrected=2),)),
           obs(30, document(), gpus=(GpuView(0, ecc_uncorrected=4),))]  # fmt: skip
    finding = run(seq)[1].findings[0]
    assert finding.kind == ECC
    assert "2 uncorrected ECC errors" in finding.reason


def test_retired_pages_are_said_not_acted_on() -> None:
    seq = [obs(0, document(), gpus=(GpuView(0, retired_pages=1),)),
           obs(30, document(), gpus=(GpuView(0, xids=(63,), retired_pages=2,
                                             retirement_pending=True),))]  # fmt: skip
    finding = run(seq)[1].findings[0]
    assert (finding.kind, finding.level, finding.restart_helps) == (
        PAGES_RETIRED, Level.DEGRADED, False)  # fmt: skip
    assert "XID 63" in finding.reason
    assert "1 more page retired" in finding.reason


def test_a_failed_row_remapping_is_said() -> None:
    seq = [obs(0, document(), gpus=(GpuView(0, retired_pages=0, remap_failed=True),))]
    finding = run(seq)[0].findings[0]
    assert finding.kind == PAGES_RETIRED
    assert "a row remapping failed" in finding.reason


def test_throttled_under_load_for_the_set_time_is_degraded() -> None:
    held = GpuView(0, utilisation=0.95, sm_clock_ratio=0.45, slowdowns=("hw-slowdown",))
    fine = GpuView(0, utilisation=0.95, sm_clock_ratio=0.97)
    idle = GpuView(0, utilisation=0.0, sm_clock_ratio=0.2)
    seq = [obs(0, document(), gpus=(held,)), obs(1800, document(), gpus=(idle,)),
           obs(3600, document(), gpus=(held,)), obs(3700, document(), gpus=(fine,))]  # fmt: skip
    assessed = run(seq)
    assert kinds(assessed[1]) == {}
    finding = assessed[2].findings[0]
    assert (finding.kind, finding.level, finding.since) == (THROTTLED, Level.DEGRADED, 0)
    assert "45%" in finding.reason
    assert "hw-slowdown" in finding.reason
    assert kinds(assessed[3]) == {}


def test_a_reading_between_two_bursts_does_not_clear_throttling() -> None:
    held = GpuView(0, utilisation=0.9, sm_clock_ratio=0.4, slowdowns=("power-cap",))
    between = GpuView(0, utilisation=0.9, sm_clock_ratio=0.2)  # clocked down for a moment
    seq = [obs(0, document(), gpus=(held,)), obs(2000, document(), gpus=(between,)),
           obs(3600, document(), gpus=(held,))]  # fmt: skip
    assert kinds(run(seq)[-1]) == {THROTTLED: Level.DEGRADED}


def test_without_utilisation_the_daemons_workers_say_whether_the_gpu_is_loaded() -> None:
    held = GpuView(0, sm_clock_ratio=0.4, slowdowns=("power-cap",))

    def busy(job: str) -> dict:
        return document(pipelines=[proving(job)], workers=[worker(0, 0, job, 4, 2.0)])

    idle = run(obs(t, document(), gpus=(held,)) for t in (0, 4000))
    loaded = run(obs(t, busy(f"j{t}"), gpus=(held,)) for t in (0, 4000))
    assert kinds(idle[-1]) == {}
    assert kinds(loaded[-1]) == {THROTTLED: Level.DEGRADED}


# --- partitions --------------------------------------------------------------------------------


def test_a_partition_in_gpu_for_ten_times_its_measured_time_is_stuck() -> None:
    state = HealthState.seeded((3.0, 3.2, 2.8))  # the bench's GPU stage (and 3.1 s seen here)
    doc = document(pipelines=[proving("j", gpu_ms=200_000)],
                   workers=[worker(0, 0, "j", 4, 200.0), worker(1, 0)])  # fmt: skip
    short = document(pipelines=[proving("j", gpu_ms=100_000)],
                     workers=[worker(0, 0, "j", 4, 100.0), worker(1, 0)])  # fmt: skip
    assessed = run([obs(0, short, totals=(3, 0)), obs(100, doc, totals=(3, 0))], state=state)
    assert kinds(assessed[0]) == {}  # 100 s: under the 120 s floor
    finding = assessed[1].findings[0]
    assert (finding.kind, finding.gpu, finding.restart_helps) == (STUCK, 0, True)
    assert "partition 4 of job j" in finding.reason
    assert "10x the measured 3.1 s" in finding.reason


def test_the_measured_time_comes_from_done_partitions_and_a_first_sighting_counts() -> None:
    # No gpu_ms at all (an older status): the time since first seen in gpu is the age.
    parts = [partition(i, "done", 1, 20_000) for i in range(4)] + [partition(4, "gpu")]
    doc = document(pipelines=[pipeline("j", parts)], workers=[worker(0, 0, "j", 4)])
    policy = HealthPolicy(stuck_factor=10, stuck_min_s=1)
    assessed = run([obs(t, doc) for t in (0, 150, 210)], policy=policy)
    assert kinds(assessed[1]) == {}  # 150 s < 10 x 20 s
    assert kinds(assessed[2]) == {STUCK: Level.DEGRADED}


def test_a_partition_stuck_on_a_lost_gpu_is_that_gpus_loss() -> None:
    doc = document(pipelines=[proving("j", gpu_ms=500_000)], workers=[worker(0, 0, "j", 4, 500.0)])
    gone = GpuView(0, answering=False, error="NVMLError_GpuIsLost")
    found = {f.kind: f for f in run([obs(0, doc, gpus=(GpuView(0, xids=(79,)),)),
                                     obs(30, doc, gpus=(gone,))])[1].findings}  # fmt: skip
    assert found[GPU_LOST].level is Level.BROKEN
    assert not found[STUCK].restart_helps


def test_stuck_findings_stand_while_the_status_does_not_answer() -> None:
    doc = document(pipelines=[proving("j", gpu_ms=500_000)], workers=[worker(0, 0, "j", 4, 500.0)])
    assessed = run([obs(0, doc), obs(30, None), obs(60, doc)])
    assert [kinds(a) for a in assessed] == [{STUCK: Level.DEGRADED}] * 3
    assert assessed[0].findings[0].since == assessed[2].findings[0].since


# --- the daemon's exits ------------------------------------------------------------------------


def test_repeated_daemon_exits_are_degraded_within_the_window_and_a_crash_loop_broken() -> None:
    seq = [obs(0, document(), exits=0), obs(60, document(), exits=2),
           obs(120, document(), exits=3), obs(4000, document(), exits=3)]  # fmt: skip
    assessed = run(seq)
    assert kinds(assessed[1]) == {}
    assert kinds(assessed[2]) == {DAEMON_EXITS: Level.DEGRADED}
    assert kinds(assessed[3]) == {}
    loop = run([obs(0, None, gpus=None, crash_loop="4 failures within 600 s")])[0]
    assert kinds(loop) == {CRASH_LOOP: Level.BROKEN}
    assert "4 failures" in loop.reason
