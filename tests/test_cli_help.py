"""Help that fits the habits of the field: ``--version``; every setting flag shows its default and
its environment variable in one form; ``run --help`` puts the few settings a fleet sets first;
every command's help ends with where to read more; and the version is in ``/metrics`` too."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from cuzk_supervisor import settings
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.cli.commands.run import FLEET_SETTINGS
from cuzk_supervisor.serve.metrics import SupervisorMetrics
from cuzk_supervisor.settings.flags import FIRST_TITLE
from cuzk_supervisor.version import VERSION

REPO = Path(__file__).resolve().parents[1]
DECLS = {decl.name: decl for decl in settings.declarations()}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"cuzk-supervisor {VERSION}\n"


def test_the_version_is_the_projects() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == VERSION


def test_metrics_carry_the_version() -> None:
    body = SupervisorMetrics(clock=lambda: 0.0).render().decode()
    assert f'cuzk_supervisor_build_info{{version="{VERSION}"}} 1.0' in body


@pytest.mark.parametrize("command", [c.name for c in cli.COMMANDS])
def test_every_setting_flag_shows_its_default_and_its_variable_alike(command: str) -> None:
    """sim's own settings say instead that it reads only their flag, not their variable
    (tests/sim/test_manager_sim_command.py)."""
    shown = [
        a for a in subparsers()[command]._actions if a.dest in DECLS and a.help != "==SUPPRESS=="
    ]
    for action in shown:
        decl = DECLS[action.dest]
        assert action.help is not None
        if command == "sim" and "sim: flag only" in action.help:
            continue
        assert action.help.endswith(f"; env: {decl.env})"), action.dest
        assert re.search(r"\((one of [^;]+; )?default: [^;]+; env: ", action.help) or (
            command == "daemon" and action.dest == "workers"
        ), action.dest


def test_the_daemon_command_says_workers_is_required_not_a_default() -> None:
    workers = next(a for a in subparsers()["daemon"]._actions if a.dest == "workers")
    assert workers.help is not None
    assert "required" in workers.help
    assert "default: 0" not in workers.help


def test_run_help_lists_what_a_fleet_sets_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    text = subparsers()["run"].format_help()
    titles = [
        line[:-1] for line in text.splitlines() if line and line[0] != " " and line[-1] == ":"
    ]
    settings_titles = [t for t in titles if t != "options"]
    assert settings_titles[:2] == ["settings sources", FIRST_TITLE]
    section = text.split(FIRST_TITLE + ":\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^  (--[a-z0-9-]+)", section, flags=re.MULTILINE)
    assert listed == [DECLS[name].flag for name in FLEET_SETTINGS]
    assert text.count(f"  {DECLS['manager_url'].flag} ") == 1  # not again in its group


@pytest.mark.parametrize("command", [c.name for c in cli.COMMANDS])
def test_every_command_help_ends_with_where_to_read_more(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    last = " ".join(subparsers()[command].format_help().rstrip().split("\n\n")[-1].split())
    assert last.startswith("Read more in the source tree: ")
    pages = re.findall(r"(README\.md|docs/[\w.-]+\.md)", last)
    assert pages
    assert [page for page in pages if not (REPO / page).is_file()] == []
