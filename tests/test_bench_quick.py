"""Every benchmark still measures every figure it declares (issue 24), and meets the targets its
run holds (issue 44).

Each ``bench/*.py`` script whose name does not start with ``_`` (found here, not listed: a new
script is run the day it is added) is run as its own process with ``--quick --json FILE``, the
options every script takes (docs/development.md, "Development"). ``bench/run.py`` runs two of
them itself, that way, and reports their rows under a prefix: those are checked in its rows
(they must be there), not run a second time. The test fails when the script crashes or exits
non-zero, when FILE is missing, does not parse or is not a list of rows, when any row holds no
figure (a value that is not a finite number, or ``NOT MEASURED`` in its name:
``bench/_harness.measured``) and when any row missed its target (``ok`` false:
``bench/_harness.missed``). A quick run holds only the targets of what must never happen (a
limit of 0: reports lost, instances ended); its other targets are a full run's, shown and not
judged (``bench/_harness.held``). The test never looks at how long anything took: benchmarks
print figures, tests do not assert speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cgrouphelpers import cgroups_writable

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

from _harness import MISSED_EXIT, Row, finish, held, measured, missed  # noqa: E402  # bench/ is not a package

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


def problems(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What the test fails on in a run's rows: each row without a figure, each missed target."""
    return [
        *(f"not measured: {row['name']}" for row in rows if not measured(row)),
        *(f"missed its target {row['target']!r}: {row['name']} = {row['value']!r}"
          for row in rows if missed(row)),
    ]  # fmt: skip


def test_a_row_that_misses_its_target_fails_the_check():
    rows = [Row("reports lost", 0, "reports", "<= 0", True).as_dict(),
            Row("requests/min", 1.0, "req/min", "<= 1.5", True).as_dict()]  # fmt: skip
    assert problems(rows) == []
    doctored = [dict(rows[0], value=2, ok=False), rows[1]]
    assert problems(doctored) == ["missed its target '<= 0': reports lost = 2"]
    # Every script ends through finish: it exits non-zero on that row, and 0 without it.
    assert finish([Row("reports lost", 2, "reports", "<= 0", False)], None) == MISSED_EXIT
    assert finish([Row("reports lost", 0, "reports", "<= 0", True)], None) == 0


def test_a_quick_run_holds_the_targets_of_what_must_never_happen():
    rows = [Row("reports lost", 2, "reports", "<= 0", False),
            Row("stop latency", 3.0, "s", "<= 2", False),
            Row("wall time", 9.0, "s")]  # fmt: skip
    quick = [row.as_dict() for row in held(rows, quick=True)]
    assert problems(quick) == ["missed its target '<= 0': reports lost = 2"]
    assert quick[1]["target"] == "full run: <= 2"
    assert quick[1]["ok"] is None
    assert len(problems([row.as_dict() for row in held(rows, quick=False)])) == 2


def test_the_scripts_are_found():
    names = {p.name for p in FOUND}
    assert {"run.py", "entrypoint.py", "rate_disturbance.py", "supervisor_delays.py", "run_days.py",
            *RUN_BY_RUN_PY} <= names, names  # fmt: skip


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
    assert out.exists(), f"no --json file (rc {done.returncode})\n{report}"
    try:
        rows = json.loads(out.read_text())
    except ValueError as exc:
        pytest.fail(f"--json file does not parse: {exc}\n{report}")
    assert isinstance(rows, list), f"not a list of rows: {rows!r}"
    assert rows, "no rows"
    not_rows = [row for row in rows if not isinstance(row, dict) or not set(row) >= ROW_KEYS]
    assert not not_rows, f"not rows of {sorted(ROW_KEYS)}: {not_rows!r}"
    failing = problems(rows)
    assert not failing, f"{script.name} --quick: {failing}\n{report}"
    assert done.returncode == 0, report
    if script.name == "run.py":
        delegated = {
            n: pre for n, pre in RUN_BY_RUN_PY.items() if writable or n != "oom_reaction.py"
        }
        absent = [
            n for n, pre in delegated.items() if not any(r["name"].startswith(pre) for r in rows)
        ]
        assert not absent, f"run.py --quick gave no rows of {absent}\n{report}"
