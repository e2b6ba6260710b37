"""``core.disk``: the free disk a run needs for the parameters and the PCE files (issue 14.2).

One figure for ``doctor`` and for the check before ``run``: the parameters less what is there,
the PCE files unless an earlier run built them, scaled down like memory against the simulator.
"""

from __future__ import annotations

import pytest

from cuzk_supervisor.core.disk import (
    PARAMS_BYTES,
    PCE_FILES_BYTES,
    REQUIRED_FREE_BYTES,
    disk_need,
)
from cuzk_supervisor.core.units import GIB


def test_a_fresh_machine_needs_the_parameters_and_the_pce_files() -> None:
    need = disk_need(0)
    assert need.total_bytes == REQUIRED_FREE_BYTES == 125 * GIB
    assert (need.params_bytes, need.pce_bytes) == (PARAMS_BYTES, PCE_FILES_BYTES)


def test_parameters_already_there_are_subtracted_but_never_below_zero() -> None:
    assert disk_need(40 * GIB).total_bytes == REQUIRED_FREE_BYTES - 40 * GIB
    assert disk_need(500 * GIB).params_bytes == 0
    assert disk_need(500 * GIB).total_bytes == PCE_FILES_BYTES
    assert disk_need(-5).total_bytes == REQUIRED_FREE_BYTES  # a nonsense size counts as none


def test_what_an_earlier_run_wrote_is_not_needed_again() -> None:
    assert disk_need(0, params_verified=True).total_bytes == PCE_FILES_BYTES
    assert disk_need(0, pce_built=True).total_bytes == PARAMS_BYTES
    assert disk_need(0, params_verified=True, pce_built=True).total_bytes == 0


def test_the_simulators_sizes_are_scaled_down_like_its_memory() -> None:
    # 1024 planned bytes a measured byte: the simulated parameters are 1/1024 of the real ones.
    need = disk_need(0, scale=1024)
    assert need.total_bytes == REQUIRED_FREE_BYTES // 1024
    # Measured bytes present count at the scale: 50 MiB on disk stand for 50 GiB.
    assert disk_need(50 << 20, scale=1024).total_bytes == (75 * GIB) // 1024
    assert disk_need(0, scale=1024, params_verified=True).params_bytes == 0


def test_the_need_is_rounded_up() -> None:
    assert disk_need(0, scale=7).total_bytes >= REQUIRED_FREE_BYTES / 7
    assert disk_need(0, scale=7).pce_bytes == -(-PCE_FILES_BYTES // 7)


def test_a_scale_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="scale"):
        disk_need(0, scale=0)
