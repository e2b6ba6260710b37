"""Shared test set-up: the helper modules in tests/ import as plain modules from any subfolder."""

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path

import pluggy
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Imported after the path above is set: they are helper modules.
import daemonhelpers
import pacehelpers
from loadhelpers import PaceWatch
from managerhelpers import ManagerProcess

PACE_DESCRIPTION_ENV = "CUZK_TEST_PACE"


def pytest_configure(config: pytest.Config) -> None:
    """The machine's pace (pacehelpers), in the main process, before the xdist workers start:
    ``make test`` measured it already (CUZK_TEST_MEASURED); a plain ``pytest`` measures it here.
    A watcher then keeps it current as other work on the machine comes and goes
    (loadhelpers.PaceWatch), in a file the workers read (its path in CUZK_TEST_PACE_FILE, which
    they inherit). A slowness forced by hand (CUZK_TEST_SLOWNESS) is kept as it is."""
    if hasattr(config, "workerinput") or os.environ.get(pacehelpers.SLOWNESS_ENV):
        return
    measured = os.environ.get(pacehelpers.MEASURED_ENV)
    pace = pacehelpers.Pace.decode(measured) if measured else pacehelpers.measure()
    os.environ[pacehelpers.MEASURED_ENV] = pace.encode()
    os.environ.setdefault(PACE_DESCRIPTION_ENV, pace.describe())
    folder = Path(tempfile.mkdtemp(prefix="cuzk-test-pace-"))
    watch = PaceWatch(
        lambda now: pace.with_contention(now).slowness, pace.cores, pace.slowness,
        folder / "slowness",
    )  # fmt: skip
    os.environ[pacehelpers.PACE_FILE_ENV] = str(watch.path)
    watch.start()
    config.stash[WATCH] = watch


WATCH = pytest.StashKey[PaceWatch]()


def pytest_unconfigure(config: pytest.Config) -> None:
    watch = config.stash.get(WATCH, None)
    if watch is not None:
        watch.stop()
        with contextlib.suppress(OSError):
            watch.path.parent.rmdir()


def pytest_report_header() -> str:
    described = os.environ.get(PACE_DESCRIPTION_ENV)
    how = f" ({described})" if described else ""
    return f"pace: slowness {pacehelpers.current():g} now{how}, kept current while the tests run"


@pytest.fixture(autouse=True)
def _pace_of_this_test() -> Generator[None, None, None]:
    """Each test keeps the slowness it started with: its time scales and deadlines agree."""
    pacehelpers.freeze(pacehelpers.current())
    yield
    pacehelpers.freeze(None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow end-to-end tests first (a stable sort: each group keeps its order): handed out
    in order, the workers start on the long tests together and fill the end with short ones,
    instead of one worker starting a 20 s test when the others are nearly done.

    On a slow or busy machine each test's hang guard (pytest-timeout, ``timeout`` in
    pyproject.toml) stretches with the slowness, like every deadline the tests wait with: with
    twice the slowness measured at the start, since the machine may get busier while they run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    timeout = float(config.getini("timeout") or 0)
    stretch = min(2 * pacehelpers.current(), pacehelpers.MAX_SLOWNESS)
    if timeout > 0 and stretch > 1:
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(timeout * stretch))


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
