"""After memory trouble (cuzk_supervisor.core.relaunch): the worker count the daemon restarts
with, the fit measured, and the plateau the new plan should level off at."""

from __future__ import annotations

from typing import Any

import pytest

from cuzk_supervisor.core.memfit import MemoryFit, fit_workers
from cuzk_supervisor.core.memory import MemoryPolicy, sim_memory_scale
from cuzk_supervisor.core.relaunch import (
    PARTITIONS_PER_POREP,
    WARMUP_PHASES,
    estimated_active_partitions,
    expected_plateau,
    measured_fit,
    model_partition_bytes,
    peak_partition_bytes,
    proofs_running,
    relaunch_workers,
)

MIB = 2**20
GIB = 2**30


@pytest.mark.parametrize("phase", sorted(WARMUP_PHASES))
def test_in_the_warmup_the_warmup_plan_is_retried(phase):
    assert relaunch_workers(phase, full_workers=8, warmup_workers=3) == 3


@pytest.mark.parametrize("phase", ["restart", "settle", "bench", "report", "run"])
def test_from_the_restart_on_the_full_plan_runs(phase):
    assert relaunch_workers(phase, full_workers=8, warmup_workers=3) == 8


def test_a_measured_fit_is_memfits_answer_when_partitions_are_active():
    args: dict[str, Any] = {
        "limit_bytes": 960 * MIB, "used_bytes": 930 * MIB, "base_bytes": 330 * MIB,
        "running_workers": 12, "target_headroom": 0.20,
    }  # fmt: skip
    fit = measured_fit(active_partitions=10, **args)
    expected = fit_workers(limit=960 * MIB, base=330 * MIB, used=930 * MIB, active_partitions=10,
                           running_workers=12, target_headroom=0.20)  # fmt: skip
    assert fit == expected
    assert fit is not None
    assert fit.workers == 7


@pytest.mark.parametrize("active", [None, 0])
def test_no_fit_when_the_daemon_says_nothing_is_active_or_cannot_say(active):
    fit = measured_fit(limit_bytes=960 * MIB, used_bytes=930 * MIB, base_bytes=330 * MIB,
                       active_partitions=active, running_workers=12,
                       target_headroom=0.2)  # fmt: skip
    assert fit is None


@pytest.mark.parametrize(
    ("proofs", "workers", "active"), [(1, 12, 10), (2, 12, 12), (1, 4, 4), (3, 40, 30), (0, 12, 0)]
)
def test_the_active_partitions_estimated_are_the_proofs_partitions_at_most_one_per_worker(
    proofs, workers, active
):
    assert PARTITIONS_PER_POREP == 10
    assert estimated_active_partitions(proofs, workers) == active


@pytest.mark.parametrize(
    ("phase", "in_flight", "running", "proofs"),
    [("warmup", None, True, 1), ("settle", None, True, 1), ("bench", 2, True, 2),
     ("bench", None, True, 0), ("run", None, True, 0), ("warmup", None, False, 0),
     ("bench", 2, False, 0)],
)  # fmt: skip
def test_the_proofs_running_are_the_phases_own_and_none_after_an_oom_kill(
    phase, in_flight, running, proofs
):
    assert proofs_running(phase, in_flight, daemon_running=running) == proofs


def test_where_the_daemon_cannot_say_the_fit_is_measured_over_the_proofs_running():
    """A daemon under memory pressure may not answer its status in time (the e2e OOM test saw
    it on a loaded machine): the warmup's one proof had 10 partitions active on 12 workers, so
    the fit is the same as with the daemon's own figure, and it says it was estimated."""
    args: dict[str, Any] = {
        "limit_bytes": 960 * MIB, "used_bytes": 930 * MIB, "base_bytes": 330 * MIB,
        "running_workers": 12, "target_headroom": 0.20,
    }  # fmt: skip
    told = measured_fit(active_partitions=10, **args)
    estimated = measured_fit(active_partitions=None, proofs_running=1, **args)
    assert told is not None
    assert estimated is not None
    assert (estimated.workers, estimated.per_partition) == (told.workers, told.per_partition)
    assert (told.workers, told.per_partition) == (7, 60 * MIB)
    assert estimated.active_estimated
    assert not told.active_estimated
    assert "estimated from 1 proof(s) running" in estimated.reason
    assert measured_fit(active_partitions=None, proofs_running=0, **args) is None
    # The daemon's own figure wins over the estimate.
    assert measured_fit(active_partitions=5, proofs_running=1, **args) != told


def test_the_plateau_is_the_base_plus_the_new_plans_partitions():
    fit = fit_workers(limit=960 * MIB, base=330 * MIB, used=930 * MIB, active_partitions=10,
                      running_workers=12, target_headroom=0.20)  # fmt: skip
    assert fit is not None
    assert expected_plateau(fit, 7) == 330 * MIB + 7 * 60 * MIB
    assert expected_plateau(fit, 5) == round(330 * MIB + 5 * fit.per_partition)
    assert expected_plateau(None, 7) is None


def test_the_models_partition_is_the_daemons_reservation_in_measured_bytes():
    policy = MemoryPolicy()
    assert model_partition_bytes(policy, 1.0) == 14 * GIB
    # The cgroup e2e test: 4 real MiB per simulated GiB.
    assert model_partition_bytes(policy, sim_memory_scale(4)) == 56 * MIB


def test_while_memory_still_grows_the_fit_aims_at_the_plateau():
    # Mid-ramp: 10 counted active at 780 MiB over 336 MiB (44.4 MiB each, most not all
    # allocated). The trend's slope says memory is still growing.
    args: dict[str, Any] = {
        "limit_bytes": 960 * MIB, "used_bytes": 780 * MIB, "base_bytes": 336 * MIB,
        "active_partitions": 10, "running_workers": 12, "target_headroom": 0.20,
        "model_per_partition": 56 * MIB,
    }  # fmt: skip
    level = measured_fit(**args, slope_bytes_per_s=0.0)
    assert level is not None
    assert level.workers == 9  # taken for a plateau: too many
    for slope in (None, -1.0):
        assert measured_fit(**args, slope_bytes_per_s=slope) == level
    growing = measured_fit(**args, slope_bytes_per_s=170 * MIB)
    assert growing is not None
    assert (growing.workers, growing.source, growing.per_partition) == (7, "model", 56 * MIB)
    peaked = measured_fit(**args, slope_bytes_per_s=170 * MIB, peak_per_partition=60.3 * MIB)
    assert peaked is not None
    assert (peaked.workers, peaked.source) == (7, "earlier peak")
    assert expected_plateau(peaked, 7) == round(336 * MIB + 7 * 60.3 * MIB)


def test_the_peak_keeps_the_largest_measurement_outside_the_warmup():
    def fit(per_mib: float) -> MemoryFit:
        made = fit_workers(limit=960 * MIB, base=330 * MIB, used=round((330 + 10 * per_mib) * MIB),
                           active_partitions=10, running_workers=12,
                           target_headroom=0.2)  # fmt: skip
        assert made is not None
        return made

    assert peak_partition_bytes(None, None, "bench") is None
    assert peak_partition_bytes(None, fit(60), "bench") == pytest.approx(60 * MIB)
    assert peak_partition_bytes(60 * MIB, fit(44), "settle") == 60 * MIB
    assert peak_partition_bytes(60 * MIB, fit(70), "settle") == pytest.approx(70 * MIB)
    for phase in sorted(WARMUP_PHASES):  # no PCE at the base yet: not a partition's figure
        assert peak_partition_bytes(None, fit(90), phase) is None
        assert peak_partition_bytes(60 * MIB, fit(90), phase) == 60 * MIB
