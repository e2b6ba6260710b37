"""Rendering the daemon's config: plan values, operator merge, read-back check."""

import os
import stat
import tomllib

import pytest
from fshelpers import full_tmpfs

from cuzk_supervisor.adapters import files
from cuzk_supervisor.daemon.config import (
    DaemonConfigValues,
    check,
    load_base,
    merge,
    write_verified,
)
from cuzk_supervisor.errors import UsageError


def values(**overrides):
    base = {
        "partition_workers": 7,
        "total_budget_gib": 168,
        "max_parallel_synthesis": 7,
        "listen": "127.0.0.1:9820",
        "param_cache": "/data/zk/params",
    }
    return DaemonConfigValues(**{**base, **overrides})


def test_rendered_file_reads_back_with_the_plan_values(tmp_path):
    path = tmp_path / "cuzk.toml"
    write_verified(path, values(), base=None)
    doc = tomllib.loads(path.read_text())
    assert doc["synthesis"]["partition_workers"] == 7
    assert doc["memory"]["total_budget"] == "168GiB"
    assert doc["pipeline"]["max_parallel_synthesis"] == 7
    assert doc["daemon"]["listen"] == "127.0.0.1:9820"
    assert doc["daemon"]["status_listen"] == "127.0.0.1:9821"
    assert doc["srs"]["param_cache"] == "/data/zk/params"


def test_operator_keys_survive_and_ours_win(tmp_path):
    base_file = tmp_path / "base.toml"
    base_file.write_text(
        '[gpus]\ngpu_workers_per_device = 3\n[memory]\ntotal_budget = "256G"\n'
        'safety_margin = "8GiB"\n[synthesis]\npartition_workers = 20\nthreads = 32\n'
    )
    path = tmp_path / "cuzk.toml"
    write_verified(path, values(), base=load_base(base_file))
    doc = tomllib.loads(path.read_text())
    assert doc["gpus"]["gpu_workers_per_device"] == 3
    assert doc["memory"]["safety_margin"] == "8GiB"
    assert doc["synthesis"]["threads"] == 32
    assert doc["synthesis"]["partition_workers"] == 7
    assert doc["memory"]["total_budget"] == "168GiB"


def test_check_reports_a_budget_the_daemon_would_misread():
    doc = merge({}, values().owned())
    doc["memory"]["total_budget"] = "256G"
    problems = check(doc, values())
    assert any("total_budget" in p for p in problems)


def test_broken_base_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "base.toml"
    bad.write_text("[memory\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_base(bad)
    with pytest.raises(UsageError, match=r"missing\.toml"):
        load_base(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "field", ["partition_workers", "total_budget_gib", "max_parallel_synthesis"]
)
def test_values_below_one_are_refused(field):
    with pytest.raises(UsageError, match=field):
        values(**{field: 0})


def test_public_listen_address_is_parsed_not_rejected_here():
    # Loopback-by-default is a settings rule; rendering only refuses what the daemon cannot parse.
    with pytest.raises(UsageError, match="host names"):
        values(listen="localhost:9820")


# --- files the supervisor owns (issue 13, items 2 and 6) -----------------------------------------


def test_a_link_planted_at_the_old_temp_path_is_not_followed(tmp_path):
    """Before issue 13 the temp file was always run_dir/.cuzk.toml.tmp: a symlink there made
    the supervisor overwrite whatever it pointed to."""
    outside = tmp_path / "outside"
    outside.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".cuzk.toml.tmp").symlink_to(outside)
    write_verified(run_dir / "cuzk.toml", values(), base=None)
    assert outside.read_text() == "precious"
    assert tomllib.loads((run_dir / "cuzk.toml").read_text())["synthesis"]["partition_workers"]


def test_config_is_0640_in_a_0750_folder_under_umask_0(tmp_path):
    old = os.umask(0)
    try:
        write_verified(tmp_path / "run" / "cuzk.toml", values(), base=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "run" / "cuzk.toml").stat().st_mode) == 0o640


def test_a_full_run_folder_is_a_one_line_write_error_and_no_temp_file(tmp_path):
    with full_tmpfs(tmp_path / "run") as folder:
        with pytest.raises(files.WriteError) as caught:
            write_verified(folder / "cuzk.toml", values(), base=None)
        assert str(caught.value) == (
            f"cannot write daemon config {folder / 'cuzk.toml'}: [Errno 28] No space left on device"
        )
        assert sorted(p.name for p in folder.iterdir()) == ["filler"]
