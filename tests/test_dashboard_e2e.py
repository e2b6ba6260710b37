"""Issue 43 acceptance: ``sim --exit-after-run`` against the simulated manager, at time scale 100
and 25, quiet or beside a daemon writing 20,000 lines a second and a fetch printing 1,000: the
``setup`` tab shows every phase in order and the fetch's closing line, ``benchdaemon`` the
daemon's ready line, and every summary line counts what it stands for (lines pushed + lines
counted = lines written, checked against the local records: the daemon's log file, the
supervisor's JSON events)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from managerhelpers import ManagerFactory, ManagerProcess
from pacehelpers import patient, scaled

pytestmark = pytest.mark.slow

PHASES = ["register", "params", "plan", "warmup", "restart", "settle", "bench", "report", "run"]
SUMMARY = re.compile(r"^\[([\d,]+) lines not pushed")


def tab(mgr: ManagerProcess, uuid: str, source: str) -> tuple[list[str], int]:
    """A tab's lines that are not summaries, and what its summaries count."""
    kept, count = [], 0
    for line in mgr.logs(uuid, source=source, tail=10_000):
        found = SUMMARY.match(line["text"])
        if found:
            count += int(found.group(1).replace(",", ""))
        else:
            kept.append(line["text"])
    return kept, count


def events(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    found = []
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def setup_written(found: list[dict[str, Any]]) -> int:
    """Lines given to the ``setup`` tab up to the shipper's last turn: the supervisor's events
    (but the child lines, which go to their own tab) and the fetch's lines (its events and the
    counts of those past the event budget)."""
    last = next(i for i, e in enumerate(found) if e["event"] == "logship.last_turn")
    before = found[: last + 1]
    mine = sum(e["event"] != "child.line" for e in before)
    fetch = [e for e in found if e.get("source") == "setup"]
    lines = sum(e["event"] == "child.line" for e in fetch)
    lines += sum(e["lines"] for e in fetch if e["event"] == "child.output_suppressed")
    return mine + lines


@pytest.fixture
def mgr(tmp_path: Path) -> Iterator[ManagerProcess]:
    with ManagerFactory(tmp_path) as factory:
        yield factory()


@pytest.mark.parametrize("scale", [100, 25])
@pytest.mark.parametrize("chatty", [False, True], ids=["quiet", "chatty"])
def test_the_dashboard_tells_the_machines_story(tmp_path, mgr, scale, chatty):
    sim = tmp_path / "sim"
    flood = ["--sim-fault", "flood:20000", "--fetch-chatter", "1000"] if chatty else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_")}
    out = subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "sim", "--sim-dir", str(sim),
         "--exit-after-run", "--log-format", "json", "--health-listen", "127.0.0.1:0",
         "--manager-url", mgr.url, "--min-rate", "1", "--time-scale", f"{scaled(scale):g}",
         "--bench-count", "4", "--memory-scale", "0.125",
         # Every line the daemon writes stays in its log files: the count the tabs must match.
         "--daemon-log-backups", "1000", *flood],
        capture_output=True, text=True, timeout=patient(400), env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (instance,) = mgr.instances()
    uuid = instance["uuid"]

    setup, setup_counted = tab(mgr, uuid, "setup")
    entered = [
        m.group(1) for line in setup if (m := re.search(r" phase\.entered phase=(\w+)", line))
    ]
    assert entered == PHASES, "\n".join([f"counted {setup_counted}", *setup])
    assert any(line.startswith("fetched 2 files") for line in setup)
    assert len(setup) + setup_counted == setup_written(events(out)), [
        e for e in events(out) if e["event"] == "logship.unsent"
    ]

    bench, bench_counted = tab(mgr, uuid, "benchdaemon")
    assert any("cuzk-daemon ready, serving on" in line for line in bench)
    run, run_counted = tab(mgr, uuid, "cuzk")
    written = 0
    for path in (sim / "log").glob("cuzk.log*"):
        with path.open("rb") as lines:
            written += sum(1 for _ in lines)
        path.unlink()  # a flood's hundreds of megabytes, counted
    # A miss says what would explain it (one miss of 2 lines in 1.1 million, once, unexplained).
    telling = ("logship.unsent", "daemon.output_pump_failed", "daemon.output_held_open",
               "childlog.unwritable", "childlog.resumed")  # fmt: skip
    said = [e for e in events(out) if e["event"] in telling]
    tabs = {"benchdaemon": (len(bench), bench_counted), "cuzk": (len(run), run_counted)}
    assert len(bench) + bench_counted + len(run) + run_counted == written, (written, tabs, said)
