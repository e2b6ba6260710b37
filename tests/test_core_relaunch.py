"""After memory trouble (cuzk_supervisor.core.relaunch): the worker count the daemon restarts
with, the fit measured, and the plateau the new plan should level off at."""

from __future__ import annotations

import pytest

from cuzk_supervisor.core.memfit import fit_workers
from cuzk_supervisor.core.relaunch import (
    WARMUP_PHASES,
    expected_plateau,
    measured_fit,
    relaunch_workers,
)

MIB = 2**20


@pytest.mark.parametrize("phase", sorted(WARMUP_PHASES))
def test_in_the_warmup_the_warmup_plan_is_retried(phase):
    assert relaunch_workers(phase, full_workers=8, warmup_workers=3) == 3


@pytest.mark.parametrize("phase", ["restart", "settle", "bench", "report", "run"])
def test_from_the_restart_on_the_full_plan_runs(phase):
    assert relaunch_workers(phase, full_workers=8, warmup_workers=3) == 8


def test_a_measured_fit_is_memfits_answer_when_partitions_are_active():
    args = {"limit_bytes": 960 * MIB, "used_bytes": 930 * MIB, "base_bytes": 330 * MIB,
            "running_workers": 12, "target_headroom": 0.20}  # fmt: skip
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


def test_the_plateau_is_the_base_plus_the_new_plans_partitions():
    fit = fit_workers(limit=960 * MIB, base=330 * MIB, used=930 * MIB, active_partitions=10,
                      running_workers=12, target_headroom=0.20)  # fmt: skip
    assert fit is not None
    assert expected_plateau(fit, 7) == 330 * MIB + 7 * 60 * MIB
    assert expected_plateau(fit, 5) == round(330 * MIB + 5 * fit.per_partition)
    assert expected_plateau(None, 7) is None
