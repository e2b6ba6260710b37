"""The policy values the settings make (``settings.policies``): each mapping declared once, every
name on both sides real, every mapped field of its setting's type, every value made from the
defaults and from settings that differ from them."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from cuzk_supervisor.adapters.logship.shipper import ShipperSettings
from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerTimeouts
from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
from cuzk_supervisor.core.bench import BenchPolicy
from cuzk_supervisor.core.healthladder import LadderPolicy
from cuzk_supervisor.core.healthpolicy import HealthPolicy
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.restart import RestartPolicy
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.daemon.spec import DaemonSettings
from cuzk_supervisor.lifecycle.values import (
    FetchSettings,
    MonitorSettings,
    PhaseSettings,
    ReporterSettings,
)
from cuzk_supervisor.settings import Settings, load
from cuzk_supervisor.settings.policies import (
    FROM_SETTINGS,
    NAMED_ALIKE,
    daemon_listen,
    daemon_settings,
    keeper_recipe,
    policy,
)

VALUES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        MemoryPolicy, RiskPolicy, RestartPolicy, BenchPolicy, ProvingTimeouts, ManagerTimeouts,
        ManagerRetry, ShipperSettings, DaemonSettings, HealthPolicy, LadderPolicy,
        PhaseSettings, ReporterSettings, MonitorSettings, FetchSettings,
    )
}  # fmt: skip


def test_every_value_is_mapped_once() -> None:
    assert sorted([*FROM_SETTINGS, *NAMED_ALIKE]) == sorted(VALUES)


@pytest.mark.parametrize("name", sorted(NAMED_ALIKE))
def test_a_value_named_alike_takes_each_field_from_its_setting(name: str) -> None:
    cls, settings = VALUES[name], typing.get_type_hints(Settings)
    for field, kind in typing.get_type_hints(cls).items():
        assert settings.get(field) == kind, (
            f"{name}.{field}: {kind}, setting: {settings.get(field)}"
        )
    s = load({}, environ={"CUZK_SUPERVISOR_MANAGER_JITTER": "0.3",
                          "CUZK_SUPERVISOR_PLAN_MEMORY_SCALE": "0.5"}).settings  # fmt: skip
    value: object = policy(cls, s)
    for f in dataclasses.fields(cls):
        assert getattr(value, f.name) == getattr(s, f.name)


def test_the_keepers_recipe_holds_the_daemon_s_settings(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, worker_commands=("curio run",), daemon_log_level="debug")
    recipe = keeper_recipe(s, tmp_path / "cg")
    assert recipe.spec == daemon_settings(s, tmp_path / "cg")
    assert recipe.restart == policy(RestartPolicy, s)
    assert (recipe.listen, recipe.status_listen) == (daemon_listen(s), s.daemon_status_listen)
    assert (recipe.worker_commands, recipe.pid_dir, recipe.log_level) == (
        ("curio run",), tmp_path, "debug")  # fmt: skip


@pytest.mark.parametrize("name", sorted(FROM_SETTINGS))
def test_both_sides_name_real_fields_of_one_type(name: str) -> None:
    cls = VALUES[name]
    fields = typing.get_type_hints(cls)
    settings = typing.get_type_hints(Settings)
    for field, setting in FROM_SETTINGS[name].items():
        assert field in {f.name for f in dataclasses.fields(cls)}, f"{name}.{field}"
        assert setting in settings, setting
        # An int setting may feed a float field (as a call with the int would); nothing else.
        assert fields[field] in (settings[setting], float if settings[setting] is int else None), (
            f"{name}.{field}: {fields[field]} from {setting}: {settings[setting]}"
        )


@pytest.mark.parametrize("name", sorted(FROM_SETTINGS))
def test_each_value_takes_its_settings(name: str) -> None:
    default: object = policy(VALUES[name], Settings(), **_given(name))
    for field, setting in FROM_SETTINGS[name].items():
        assert getattr(default, field) == getattr(Settings(), setting)


def test_settings_that_differ_reach_the_values() -> None:
    env = {
        "CUZK_SUPERVISOR_RESTART_BACKOFF_INITIAL_S": "2.5",
        "CUZK_SUPERVISOR_BENCH_COUNT": "7",
        "CUZK_SUPERVISOR_MEMORY_MARGIN_FRACTION": "0.3",
        "CUZK_SUPERVISOR_DAEMON_STARTUP_DEADLINE_S": "123",
    }
    s = load({}, environ=env).settings
    assert policy(RestartPolicy, s).initial_backoff_s == 2.5
    assert policy(BenchPolicy, s).max_proofs == 7
    assert policy(MemoryPolicy, s).safety_margin_fraction == 0.3
    assert policy(ProvingTimeouts, s).startup_deadline_s == 123.0
    assert daemon_settings(s, None).startup_deadline_s == 123.0


def test_the_daemon_s_files_and_address_follow_its_folders(tmp_path: Path) -> None:
    s = Settings(run_dir=tmp_path / "run", log_dir=tmp_path / "log")
    values = daemon_settings(s, tmp_path / "cg")
    assert values.config_path == tmp_path / "run" / "cuzk.toml"
    assert values.log_path == tmp_path / "log" / "cuzk.log"
    assert values.cgroup_dir == tmp_path / "cg"
    assert daemon_listen(s) == f"unix://{(tmp_path / 'run' / 'cuzk.sock').resolve()}"
    assert daemon_listen(dataclasses.replace(s, daemon_listen="127.0.0.1:9")) == "127.0.0.1:9"


def _given(name: str) -> dict[str, object]:
    return {"config_path": Path("c"), "log_path": None} if name == "DaemonSettings" else {}
