"""The settings baked into the image at build time: the bake that writes them, and the layer of
``settings.load`` that reads them (below flag, environment and config file; above defaults)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.cli import bake
from cuzk_supervisor.errors import UsageError


def image_env(path: Path, **more: str) -> dict[str, str]:
    return {settings.IMAGE_SETTINGS_FILE_ENV: str(path), **more}


def test_an_absent_image_file_changes_nothing(tmp_path: Path) -> None:
    loaded = settings.load({}, image_env(tmp_path / "none.toml"))
    assert loaded.settings.manager_url == ""
    assert loaded.sources["manager_url"] == "default"


def test_image_file_is_below_flag_environment_and_config_file(tmp_path: Path) -> None:
    image = tmp_path / "image.toml"
    image.write_text('manager_url = "http://baked:1"\nbench_budget_s = 1000\nlog_level = "debug"\n')
    config = tmp_path / "config.toml"
    config.write_text("bench_budget_s = 1100\n")
    env = image_env(image, CUZK_SUPERVISOR_LOG_LEVEL="warning")
    loaded = settings.load({}, env)
    assert loaded.settings.manager_url == "http://baked:1"
    assert loaded.sources["manager_url"] == f"image file {image}"
    loaded = settings.load({"config_file": str(config)}, env)
    assert loaded.settings.bench_budget_s == 1100, "the config file wins over the image"
    assert loaded.settings.log_level == "warning", "the environment wins over the image"
    loaded = settings.load({"manager_url": "http://flag:2"}, env)
    assert loaded.settings.manager_url == "http://flag:2"


def test_a_secret_in_the_image_file_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "image.toml"
    image.write_text('manager_token = "s3cret"\n')
    with pytest.raises(UsageError, match="manager_token must not be baked") as caught:
        settings.load({}, image_env(image))
    assert "s3cret" not in str(caught.value)


def test_a_bad_value_in_the_image_file_names_the_file(tmp_path: Path) -> None:
    image = tmp_path / "image.toml"
    image.write_text("bench_budget_s = -5\n")
    with pytest.raises(UsageError, match="image file"):
        settings.load({}, image_env(image))


def test_bake_writes_a_file_the_supervisor_reads(tmp_path: Path) -> None:
    out = tmp_path / "etc" / "settings.toml"
    old = os.umask(0o077)
    try:
        rc = bake.main(
            [
                "--out", str(out), "--manager-url", 'http://m:8080/a"b',
                "--settings", 'bench_budget_s = 13.5\n[daemon]\nbinary = "cuzk-sim-daemon"',
            ]
        )  # fmt: skip
    finally:
        os.umask(old)
    assert rc == 0
    assert stat.S_IMODE(out.stat().st_mode) == bake.FILE_MODE, "the mode we choose, not the umask"
    assert stat.S_IMODE(out.parent.stat().st_mode) == bake.FOLDER_MODE
    loaded = settings.load({}, image_env(out)).settings
    assert loaded.manager_url == 'http://m:8080/a"b'
    assert loaded.bench_budget_s == 13.5
    assert loaded.daemon_binary == "cuzk-sim-daemon"


@pytest.mark.parametrize(
    ("url", "extra", "why"),
    [
        ("", 'manager_token = "t0ken"', "manager_token must not be baked"),
        ("ftp://m", "", "an http(s) URL"),
        ("", "bench_budget_s = -1", "bench_budget_s"),
        ("", "no_such_setting = 1", "unknown setting"),
        ("", "bench_budget_s = ", "not valid TOML"),
    ],
)
def test_bake_refuses_what_cannot_work_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, extra: str, why: str
) -> None:
    out = tmp_path / "settings.toml"
    rc = bake.main(["--out", str(out), "--manager-url", url, "--settings", extra])
    assert rc == exitcodes.USAGE
    err = capsys.readouterr().err
    assert why in err
    assert len(err.strip().splitlines()) == 1, err
    assert "t0ken" not in err
    assert not out.exists()
