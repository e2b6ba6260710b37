"""``cuzk-supervisor sim`` against a manager it did not start (``--manager-url``), its default
label, the one warning for a label the manager cannot match, and its help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from managerhelpers import ManagerFactory, ManagerProcess
from simhelpers import quick_sim

from cuzk_supervisor import settings
from cuzk_supervisor.cli.commands.sim import DEMO_LABEL, SIM_OWNED
from cuzk_supervisor.core.labels import is_platform_label

REPORTS = ["/register", "/param-done", "/bench-done", "/running"]


@pytest.fixture
def mgr(tmp_path: Path) -> Iterator[ManagerProcess]:
    with ManagerFactory(tmp_path) as factory:
        yield factory()


def run_sim(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_")}
    child_env.update(env or {})
    cmd = [sys.executable, "-m", "cuzk_supervisor", "sim", "--sim-dir", str(tmp_path / "sim"),
           "--exit-after-run", "--log-format", "json",
           "--health-listen", "127.0.0.1:0",
           # What these tests check is settled at the start: the demo's pace is not needed.
           *quick_sim(), *args]  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=child_env, check=False
    )


def applied(mgr: ManagerProcess) -> list[str]:
    return [
        e["path"]
        for e in mgr.requests()
        if e["path"] in REPORTS and not e["faulted"] and e["status"] == 200
    ]


def test_sim_with_a_manager_url_uses_that_manager_and_starts_none(
    tmp_path: Path, mgr: ManagerProcess
) -> None:
    out = run_sim(tmp_path, "--manager-url", mgr.url, "--label", "my-box")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"sim: manager {mgr.url} (given by --manager-url, none simulated)" in out.stdout
    assert not (tmp_path / "sim" / "manager.db").exists()  # no simulated manager ran
    # The /running just before /bench-done is the check for a kill from the dashboard.
    assert applied(mgr)[:5] == ["/register", "/param-done", "/running", "/bench-done", "/running"]
    assert next(e["json"]["label"] for e in mgr.requests(path="/register")) == "my-box"
    (inst,) = mgr.instances()
    assert (inst["label"], inst["state"]) == ("my-box", "running")
    # the label cannot be matched by a real manager's sweep: one warning, at start
    both = out.stdout + out.stderr
    assert both.count("label.unmatchable") == 1, both[-3000:]
    assert both.index("label.unmatchable") < both.index("manager.registered")


def test_sim_default_label_is_a_platform_label_and_ignores_the_environment(
    tmp_path: Path, mgr: ManagerProcess
) -> None:
    assert is_platform_label(DEMO_LABEL)
    out = run_sim(tmp_path, "--manager-url", mgr.url, env={"CUZK_SUPERVISOR_LABEL": "from-env"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [inst["label"] for inst in mgr.instances()] == [DEMO_LABEL]
    assert "label.unmatchable" not in out.stdout + out.stderr


def test_manager_fault_needs_the_simulated_manager(tmp_path: Path) -> None:
    out = run_sim(
        tmp_path, "--manager-url", "http://127.0.0.1:9", "--manager-fault", "fail_rate=0.5"
    )
    assert out.returncode == 2
    assert "--manager-fault" in out.stderr
    assert "--manager-url" in out.stderr


def test_help_says_which_settings_sim_takes_from_flags_only() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "sim", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip
    # one block per option: its line and the help lines under it, whitespace made single
    blocks = re.split(r"\n(?=  -)", out.stdout)
    options = [" ".join(block.split()) for block in blocks if block.startswith("  --")]
    lines = {
        decl.name: next(line for line in options if re.match(rf"{decl.flag}[ ,]", line))
        for decl in settings.declarations()
    }
    for name, line in lines.items():
        decl = next(d for d in settings.declarations() if d.name == name)
        if name in SIM_OWNED:
            assert "sim: flag only" in line, line
            assert f"not ${decl.env}" in line, line
        else:  # read as `run` reads it (the help no longer names each variable: issue 14.5)
            assert "sim: flag only" not in line, line
    assert "never from CUZK_SUPERVISOR_*" in " ".join(out.stdout.split())
    assert "--manager-url URL" in out.stdout
