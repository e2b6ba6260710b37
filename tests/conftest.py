"""Shared test set-up: the helper modules in tests/ import as plain modules from any subfolder."""

import contextlib
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path

import pluggy
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Imported after the path above is set: they are helper modules.
import daemonhelpers
import pacehelpers
from managerhelpers import ManagerProcess


def pytest_configure(config: pytest.Config) -> None:
    """The machine's pace, measured once per session (pacehelpers): ``make test`` measured it
    already and says so in CUZK_TEST_SLOWNESS; a plain ``pytest`` measures it here, in the main
    process, before the xdist workers start, and hands it to them the same way."""
    if os.environ.get(pacehelpers.SLOWNESS_ENV):
        return
    pace = pacehelpers.measure()
    os.environ[pacehelpers.SLOWNESS_ENV] = f"{pace.slowness:g}"
    os.environ[PACE_DESCRIPTION_ENV] = pace.describe()


PACE_DESCRIPTION_ENV = "CUZK_TEST_PACE"


def pytest_report_header() -> str:
    described = os.environ.get(PACE_DESCRIPTION_ENV)
    how = f" ({described})" if described else ""
    return f"pace: slowness {pacehelpers.slowness():g}{how}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow end-to-end tests first (a stable sort: each group keeps its order): handed out
    in order, the workers start on the long tests together and fill the end with short ones,
    instead of one worker starting a 20 s test when the others are nearly done.

    On a slow machine each test's hang guard (pytest-timeout, ``timeout`` in pyproject.toml)
    stretches with the session's slowness, like every deadline the tests wait with."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    timeout = float(config.getini("timeout") or 0)
    if timeout > 0 and pacehelpers.slowness() > 1:
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(pacehelpers.patient(timeout)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A failed test's report shows how each supervisor it started ended and what it printed;
    without this a timeout in an end-to-end test says nothing about why."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for n, sup in enumerate(daemonhelpers.STARTED):
            report.sections.append((f"supervisor {n} ({report.when})", sup.describe()))
    if report.when == "teardown":
        daemonhelpers.STARTED.clear()


@pytest.fixture
def manager(tmp_path: Path) -> Generator[Callable[..., ManagerProcess], None, None]:
    """Start simulated managers (real processes) for an end-to-end test; all killed after."""
    managers: list[ManagerProcess] = []

    def start(*args: str) -> ManagerProcess:
        mgr = ManagerProcess.start(tmp_path / "manager.db", "--check-interval", "1", *args)
        managers.append(mgr)
        return mgr

    yield start
    for mgr in managers:
        mgr.kill()
    # A test that failed half-way may leave an orphaned daemon: never let it outlive the test.
    for proc in daemonhelpers.processes_mentioning(str(tmp_path)):
        with contextlib.suppress(psutil.Error):
            proc.kill()
