"""Settings: every one reachable by flag, env and file; precedence; validation; redaction."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerTimeouts
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings.policies import policy
from cuzk_supervisor.settings.values import _bad

DECLS = settings.declarations()


SPECIAL = {
    # Values that must also satisfy a rule across settings or a format.
    "manager_url": ("http://127.0.0.1:7001", "http://127.0.0.1:7001"),
    "restart_backoff_initial_s": ("2.5", 2.5),
    "restart_backoff_max_s": ("90", 90.0),
    "memory_sample_interval_s": ("2.5", 2.5),
    "memory_alert_sample_interval_s": ("0.05", 0.05),
    "params_expected": ("a.params:10 'b c.vk:20'", ("a.params:10", "b c.vk:20")),
    "daemon_log_level": ("cuzk=debug,info", "cuzk=debug,info"),
}


def sample(decl):
    """A valid non-default raw text value and the typed value it must become."""
    if decl.name in SPECIAL:
        return SPECIAL[decl.name]
    if decl.choices:
        choice = next(c for c in decl.choices if c != decl.default)
        return choice, choice
    return {
        "bool": ("false" if decl.default else "true", not decl.default),
        "int": (str(int(decl.minimum or 0) + 7), int(decl.minimum or 0) + 7),
        "float": float_sample(decl),
        "str": ("127.0.0.1:7001", "127.0.0.1:7001"),
        "path": ("/tmp/x/y", Path("/tmp/x/y")),
        "optional_path": ("/tmp/base.toml", Path("/tmp/base.toml")),
        "list": ("a 'b c'", ("a", "b c")),
    }[decl.kind]


def float_sample(decl):
    """A value inside the setting's bounds that no default uses."""
    if decl.maximum is None:
        return "123.5", 123.5
    low = decl.minimum if decl.minimum is not None else 0.0
    value = low + (decl.maximum - low) / 2 if decl.maximum - low < 1 else low + 0.5
    return str(value), value


def parse_flags(argv):
    parser = argparse.ArgumentParser()
    settings.add_flags(parser)
    return vars(parser.parse_args(argv))


def toml_literal(decl, raw, typed):
    if decl.kind == "bool":
        return "true" if typed else "false"
    if decl.kind in ("int", "float"):
        return raw
    if decl.kind == "list":
        return "[" + ", ".join(f'"{item}"' for item in typed) + "]"
    return f'"{raw}"'


@pytest.mark.parametrize("decl", DECLS, ids=[d.name for d in DECLS])
def test_every_setting_reachable_by_flag_env_and_file(decl, tmp_path):
    raw, typed = sample(decl)
    flag = (
        [f"--{'' if typed else 'no-'}{decl.flag[2:]}"] if decl.kind == "bool" else [decl.flag, raw]
    )
    by_flag = settings.load(parse_flags(flag), environ={})
    assert getattr(by_flag.settings, decl.name) == typed
    assert by_flag.sources[decl.name] == "flag"

    by_env = settings.load({}, environ={decl.env: raw})
    assert getattr(by_env.settings, decl.name) == typed
    assert by_env.sources[decl.name] == f"env {decl.env}"

    file = tmp_path / "s.toml"
    file.write_text(f"{decl.name} = {toml_literal(decl, raw, typed)}\n")
    by_file = settings.load({"config_file": str(file)}, environ={})
    assert getattr(by_file.settings, decl.name) == typed
    assert by_file.sources[decl.name] == f"file {file}"


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    file = tmp_path / "s.toml"
    file.write_text("bench_count = 3\nbench_concurrency = 3\n[daemon]\nbinary = 'from-file'\n")
    env = {
        settings.CONFIG_FILE_ENV: str(file),
        "CUZK_SUPERVISOR_BENCH_COUNT": "4",
        "CUZK_SUPERVISOR_DAEMON_BINARY": "from-env",
    }
    loaded = settings.load(parse_flags(["--bench-count", "5"]), environ=env)
    s = loaded.settings
    assert s.bench_count == 5  # flag
    assert s.daemon_binary == "from-env"  # env over file
    assert s.bench_concurrency == 3  # file (section-less key)
    assert s.max_workers == 12  # default
    assert loaded.sources["max_workers"] == "default"


def test_section_tables_flatten_to_setting_names(tmp_path):
    file = tmp_path / "s.toml"
    file.write_text("[daemon]\nstop_grace_s = 2.5\n")
    assert settings.load({"config_file": str(file)}, environ={}).settings.daemon_stop_grace_s == 2.5


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"CUZK_SUPERVISOR_BENCH_COUNT": "0"}, "bench_count = '0'"),
        ({"CUZK_SUPERVISOR_BENCH_COUNT": "two"}, "must be an integer >= 1"),
        ({"CUZK_SUPERVISOR_LOG_LEVEL": "loud"}, "one of debug, info, warning, error"),
        ({"CUZK_SUPERVISOR_PROACTIVE_OOM": "maybe"}, "true or false"),
        ({"CUZK_SUPERVISOR_AWAIT_DEADLINE_S": "nan"}, "await_deadline_s"),
        ({"CUZK_SUPERVISOR_WARMUP_WORKERS": "13"}, "warmup_workers=13"),
        ({"CUZK_SUPERVISOR_MEMORY_ALERT_SAMPLE_INTERVAL_S": "2"}, "must be <= memory_sample"),
        (
            {"CUZK_SUPERVISOR_RESTART_BACKOFF_MAX_S": "0.5"},
            "restart_backoff_max_s=0.5: must be >= restart_backoff_initial_s (1)",
        ),
        (
            {"CUZK_SUPERVISOR_MANAGER_BACKOFF_MAX_S": "0.2"},
            "manager_backoff_max_s=0.2: must be >= manager_backoff_initial_s (0.5)",
        ),
        ({"CUZK_SUPERVISOR_MANAGER_URL": "ftp://x"}, "manager_url"),
        ({"CUZK_SUPERVISOR_PARAMS_EXPECTED": "a.params"}, "NAME:BYTES"),
    ],
)
def test_bad_values_name_the_setting(env, fragment):
    with pytest.raises(UsageError) as caught:
        settings.load({}, environ=env)
    assert fragment in str(caught.value)


def test_secret_is_redacted_in_errors():
    decl = next(d for d in DECLS if d.secret)
    assert "***" in str(_bad(decl, "hunter2", "env"))


def test_unknown_file_key_is_an_error(tmp_path):
    file = tmp_path / "s.toml"
    file.write_text("bench_cuont = 3\n")
    with pytest.raises(UsageError, match="bench_cuont"):
        settings.load({"config_file": str(file)}, environ={})


def test_config_command_redacts_a_secret_set_by_env_and_exits_2_on_bad_value():
    env = {"CUZK_SUPERVISOR_MANAGER_TOKEN": "hunter2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "config", "--manager-url", "http://u:pw@h:1/"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert "hunter2" not in out.stdout
    assert "pw@" not in out.stdout
    token_line = next(line for line in out.stdout.splitlines() if line.startswith("manager_token"))
    assert "***" in token_line
    assert "env CUZK_SUPERVISOR_MANAGER_TOKEN" in token_line
    bad = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "config", "--bench-count", "-1"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "bench_count" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(settings.ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_json_values_keep_their_types(clean_env, capsys):
    """Numbers stay numbers, booleans booleans, lists lists, unset is null (all were strings)."""
    clean_env.setenv("CUZK_SUPERVISOR_MANAGER_TOKEN", "hunter2")
    clean_env.setenv("CUZK_SUPERVISOR_DAEMON_ARGS", "--a 'b c'")
    assert cli.main(["config", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert len(rows) == len(DECLS)
    value = {name: row["value"] for name, row in rows.items()}
    assert value["bench_count"] == 12
    assert type(value["bench_count"]) is int
    assert value["memory_margin_fraction"] == 0.25
    assert value["daemon_stop_grace_s"] == 10.0
    assert type(value["daemon_stop_grace_s"]) is float
    assert value["proactive_oom"] is True
    assert value["exit_after_run"] is False
    assert value["daemon_base_config"] is None
    assert value["params_expected"] == []
    assert value["daemon_args"] == ["--a", "b c"]
    assert value["state_dir"] == "/var/lib/cuzk-supervisor"
    assert value["manager_token"] == "***"
    assert rows["manager_token"]["source"] == "env CUZK_SUPERVISOR_MANAGER_TOKEN"
    assert rows["log_level"]["group"] == "logging"


def test_every_setting_has_a_group_that_says_what_it_is_for():
    by_group: dict[str, set[str]] = {}
    for decl in DECLS:
        assert decl.group in settings.GROUPS
        by_group.setdefault(decl.group, set()).add(decl.name)
    assert by_group["logging"] == {"log_level", "log_format"}  # not under files
    assert by_group["folders"] == {"state_dir", "run_dir", "log_dir"}
    assert {"params_expected", "params_fetch_command"} <= by_group["params"]
    # The declaration order is the groups' order, so help and docs/configuration.md list them
    # together.
    order = [decl.group for decl in DECLS]
    assert order == sorted(order, key=list(settings.GROUPS).index)


@pytest.mark.parametrize("decl", DECLS, ids=[d.name for d in DECLS])
def test_every_flag_help_is_plain_with_a_metavar_and_its_default(decl):
    text = settings.help_text(decl)
    assert "`" not in text
    if decl.kind != "bool":
        assert settings.metavar(decl) not in ("V", "")
    shown = settings.format_value(decl, decl.default)
    if shown:
        assert f"default: {shown}" in text


def test_the_memory_sample_intervals_reach_the_risk_policy():
    env = {
        "CUZK_SUPERVISOR_MEMORY_SAMPLE_INTERVAL_S": "0.5",
        "CUZK_SUPERVISOR_MEMORY_ALERT_SAMPLE_INTERVAL_S": "0.02",
    }
    risk = policy(RiskPolicy, settings.load({}, environ=env).settings)
    assert (risk.interval_s, risk.fast_interval_s) == (0.5, 0.02)


def test_the_manager_settings_reach_its_client():
    env = {
        "CUZK_SUPERVISOR_MANAGER_CONNECT_TIMEOUT_S": "1.5",
        "CUZK_SUPERVISOR_MANAGER_READ_TIMEOUT_S": "7",
        "CUZK_SUPERVISOR_MANAGER_BACKOFF_INITIAL_S": "0.25",
        "CUZK_SUPERVISOR_MANAGER_BACKOFF_MAX_S": "4",
        "CUZK_SUPERVISOR_MANAGER_RETRY_S": "90",
    }
    s = settings.load({}, environ=env).settings
    timeouts, retry = policy(ManagerTimeouts, s), policy(ManagerRetry, s)
    assert (timeouts.connect_s, timeouts.read_s) == (1.5, 7.0)
    assert (retry.backoff_base_s, retry.backoff_max_s, retry.report_stop_s) == (0.25, 4.0, 90.0)
