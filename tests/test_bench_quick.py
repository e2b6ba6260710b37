"""Every benchmark still measures every figure it declares (issue 24).

Each ``bench/*.py`` script whose name does not start with ``_`` (found here, not listed: a new
script is run the day it is added) is run as its own process with ``--quick --json FILE``, the
options every script takes (docs/development.md, "Development"). ``bench/run.py`` runs two of
them itself, that way, and reports their rows under a prefix: those are checked in its rows (they
must be there), not run a second time. The test fails when the script crashes or
exits non-zero, when FILE is missing, does not parse or is not a list of rows, and when any row
holds no figure: a value that is not a finite number, or ``NOT MEASURED`` in its name (how
``bench/_harness.failed`` spells a figure that could not be measured). It never looks at the
figures themselves nor at how long anything took: benchmarks print figures, tests do not assert
speed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cgrouphelpers import cgroups_writable

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
FOUND = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
# The scripts bench/run.py runs with --quick --json FILE itself, and the prefix of their rows.
RUN_BY_RUN_PY = {"oom_reaction.py": "oom: ", "frozen_recovery.py": "frozen: "}
SCRIPTS = [p for p in FOUND if p.name not in RUN_BY_RUN_PY]
# A quick run takes seconds; this is only the point at which a hung script is given up on.
TIMEOUT_S = 100
# Without a writable memory cgroup (tests/test_oom_cgroup.py skips then too) run.py is asked for
# every figure but oom_reaction.py's.
RUN_FIGURES_WITHOUT_CGROUP = (
    "run_phase", "crash", "readiness", "stop", "rate", "overhead", "log_throughput",
    "frozen_recovery",
)  # fmt: skip
ROW_KEYS = {"name", "value", "unit", "target", "ok"}


def _env() -> dict[str, str]:
    """This environment without settings meant for a real instance or another run."""
    foreign = ("CUZK_SUPERVISOR_", "CUZK_SIM_", "VAST_", "MIN_RATE")
    return {k: v for k, v in os.environ.items() if not k.startswith(foreign)}


def _holds_no_figure(row: dict[str, Any]) -> bool:
    value = row.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return True
    return "NOT MEASURED" in str(row.get("name", "")).upper()


def test_the_scripts_are_found():
    names = {p.name for p in FOUND}
    assert {"run.py", "entrypoint.py", "rate_disturbance.py", *RUN_BY_RUN_PY} <= names, names


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_quick_run_measures_every_row(script: Path, tmp_path: Path):
    out = tmp_path / "rows.json"
    argv = [sys.executable, str(script), "--quick", "--json", str(out)]
    writable, _ = cgroups_writable()
    if not writable and script.name == "run.py":
        argv += ["--only", *RUN_FIGURES_WITHOUT_CGROUP]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO, env=_env()
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script.name} --quick still running after {TIMEOUT_S} s: {exc.stderr!r}")
    report = (
        f"{' '.join(argv[1:])}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert done.returncode == 0, report
    assert out.exists(), f"no --json file\n{report}"
    try:
        rows = json.loads(out.read_text())
    except ValueError as exc:
        pytest.fail(f"--json file does not parse: {exc}\n{report}")
    assert isinstance(rows, list), f"not a list of rows: {rows!r}"
    assert rows, "no rows"
    not_rows = [row for row in rows if not isinstance(row, dict) or not set(row) >= ROW_KEYS]
    assert not not_rows, f"not rows of {sorted(ROW_KEYS)}: {not_rows!r}"
    unmeasured = [row["name"] for row in rows if _holds_no_figure(row)]
    assert not unmeasured, f"{script.name} --quick left rows unmeasured: {unmeasured}\n{report}"
    if script.name == "run.py":
        delegated = {
            n: pre for n, pre in RUN_BY_RUN_PY.items() if writable or n != "oom_reaction.py"
        }
        absent = [
            n for n, pre in delegated.items() if not any(r["name"].startswith(pre) for r in rows)
        ]
        assert not absent, f"run.py --quick gave no rows of {absent}\n{report}"
