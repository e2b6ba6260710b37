"""``cuzk-supervisor sim``'s own GPUs' folder and health watch (issue 44), as values: the folder
the simulated daemon keeps the GPUs' condition in (``--gpu-dir``) is made with our mode whatever
the umask, a link planted there is refused, not followed, ``--fresh`` forgets the condition;
the watch's durations are the field's at the demo's pace. The runs are in
tests/test_sim_run_phase_health_e2e.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.files import DIR_MODE
from cuzk_supervisor.cli.commands import sim
from cuzk_supervisor.cli.main import build_parser
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.machine.gpustate import FILE, GpuState


def test_the_folder_has_our_mode_whatever_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "gpus"
    old = os.umask(0o077)
    try:
        sim._gpu_folder(folder, fresh=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == DIR_MODE
    folder.chmod(0o777)  # one left wide by hand: ours again
    sim._gpu_folder(folder, fresh=False)
    assert stat.S_IMODE(folder.stat().st_mode) == DIR_MODE


@pytest.mark.parametrize("planted", ["link-to-folder", "file"])
def test_a_link_or_file_planted_there_is_refused_and_not_followed(
    tmp_path: Path, planted: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    (elsewhere / FILE).write_text("{}")
    folder = tmp_path / "gpus"
    if planted == "file":
        folder.write_text("")
    else:
        folder.symlink_to(elsewhere)
    with pytest.raises(UsageError, match="simulated GPUs' folder") as refused:
        sim._gpu_folder(folder, fresh=True)
    if planted != "file":
        assert "symbolic link" in str(refused.value)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o777  # never chmod-ed through the link
    assert (elsewhere / FILE).exists()  # nor cleaned through it


def test_fresh_forgets_the_condition_and_a_plain_start_keeps_it(tmp_path: Path) -> None:
    folder = tmp_path / "gpus"
    sim._gpu_folder(folder, fresh=False)
    state = GpuState(gpus=1, folder=folder)
    state.lose(0)
    sim._gpu_folder(folder, fresh=False)
    assert GpuState.load(folder, 1).condition(0).lost  # a lost card stays lost
    sim._gpu_folder(folder, fresh=True)
    assert not (folder / FILE).exists()
    assert not GpuState.load(folder, 1).condition(0).lost


def test_the_demo_passes_its_folder_to_the_daemon(tmp_path: Path) -> None:
    args = build_parser(["sim"]).parse_args(["sim", "--sim-dir", str(tmp_path)])
    machine = sim._check_simulator(args, tmp_path)
    assert machine.gpu_dir == tmp_path / sim.GPU_DIR


def test_the_watch_runs_at_the_demos_pace_never_below_what_a_laptop_can_tell() -> None:
    defaults = {
        d.name: float(d.default) for d in settings.declarations() if d.name in sim.HEALTH_SCALED
    }
    at_100 = sim._health_settings(100.0)
    assert set(at_100) == set(sim.HEALTH_SCALED) <= set(sim.SIM_OWNED)
    assert at_100["health_interval_s"] == pytest.approx(defaults["health_interval_s"] / 100)
    assert at_100["health_stuck_min_s"] == pytest.approx(defaults["health_stuck_min_s"] / 100)
    assert at_100["health_throttle_s"] == pytest.approx(defaults["health_throttle_s"] / 100)
    at_a_million = sim._health_settings(1e6)
    assert at_a_million["health_interval_s"] == sim.DEMO_HEALTH_INTERVAL_MIN_S
    others = {k: v for k, v in at_a_million.items() if k != "health_interval_s"}
    assert set(others.values()) == {sim.DEMO_HEALTH_THRESHOLD_MIN_S}
