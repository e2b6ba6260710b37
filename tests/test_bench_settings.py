"""The benchmarks' settings are ones the supervisor accepts: a value a setting refuses made two
benchmarks report NOT MEASURED (crash_loop_failures above its maximum) with no test failing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cuzk_supervisor import settings

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import _settings as bench_settings  # noqa: E402  # bench/ is not a package


@pytest.mark.parametrize("faults", [(), ("exit:3,after_proofs=1",)])
def test_the_daemon_only_settings_load(tmp_path: Path, faults: tuple[str, ...]) -> None:
    env = bench_settings.daemon_only(tmp_path, 100.0, faults)
    loaded = settings.load({}, environ=env).settings
    assert loaded.crash_loop_failures == 1000


def test_the_lifecycle_settings_load(tmp_path: Path) -> None:
    env = bench_settings.lifecycle(tmp_path, "http://127.0.0.1:7001", 100.0)
    assert settings.load({}, environ=env).settings.manager_url == "http://127.0.0.1:7001"
