"""What a real ``run`` loads: no module of the simulator, and no heavy part whose feature is off.

``run`` is started against a stand-in daemon, the simulator behind a script named ``cuzk`` (so
the supervisor sees a daemon binary like any other: ``cli.simhandoff`` finds no simulator in its
settings), kept in the run phase until its loops have run, and stopped with SIGTERM; the names
in ``sys.modules`` are written at its exit by ``tests/loadedmodules.py``, a launcher outside the
product. Issue 35: the supervisor lives for days beside the daemon on every machine, and what
it imports for nothing is memory it holds for nothing.
"""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from daemonhelpers import Supervisor
from lifecyclehelpers import lifecycle_env
from pacehelpers import patient, scaled
from simhelpers import poll_until

from cuzk_supervisor import exitcodes

LAUNCHER = Path(__file__).with_name("loadedmodules.py")
MEMORY_SCALE = 0.125

# Loaded by no real run, whatever its settings: the simulator, the other commands, the doctor
# (and httpx, which only the doctor's checks use: the manager client is the standard library's).
NEVER = (
    "httpx",
    "cuzk_supervisor.sim",
    "cuzk_supervisor.cli.commands.sim",
    "cuzk_supervisor.cli.commands.prove",
    "cuzk_supervisor.cli.commands.doctor",
    "cuzk_supervisor.cli.commands.plan",
    "cuzk_supervisor.cli.commands.daemon",
    "cuzk_supervisor.cli.doctor",
)
# Off a terminal (JSON lines on stderr) there is no terminal view; with gpu_probe none, no NVML.
VIEW = ("rich", "cuzk_supervisor.cli.screen", "cuzk_supervisor.cli.view")
NVML = ("pynvml", "cuzk_supervisor.adapters.machine.nvmlevents")
# With the health server off nothing serves /metrics: no server, no metrics registry.
HEALTH_SERVER = ("cuzk_supervisor.serve.health", "cuzk_supervisor.serve.metrics")


def among(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``prefixes`` or inside one of them (a package)."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def stand_in_daemon(folder: Path) -> Path:
    """A daemon binary the supervisor cannot tell from any other: the simulator behind it."""
    script = folder / "bin" / "cuzk"
    script.parent.mkdir(parents=True)
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cuzk_supervisor.sim.daemon "$@"\n'
    )
    script.chmod(0o755)
    return script


def loaded_by_run(tmp_path: Path, manager_url: str, **settings: Any) -> set[str]:
    """The modules a ``run`` against the stand-in daemon loaded, from its start to its stop
    in the run phase (after its status line there: the run phase's loops have run)."""
    time_scale, deadline_s = scaled(200.0), patient(180.0)  # only a hang reaches the deadline
    env = lifecycle_env(
        tmp_path, manager_url, time_scale=time_scale, memory_scale=MEMORY_SCALE,
        daemon_binary=str(stand_in_daemon(tmp_path)),
        daemon_args=shlex.join(["--time-scale", f"{time_scale:g}",
                                "--memory-scale", f"{MEMORY_SCALE:g}"]),
        gpu_probe="none", **settings,
    )  # fmt: skip
    out = tmp_path / "modules.txt"
    run = Supervisor([], prefix=[sys.executable, str(LAUNCHER), str(out)], command="run", env=env)
    try:
        poll_until(lambda: "run" in run.phases(), deadline_s, what="the run phase")
        entered = run.named("phase.entered")[-1]
        poll_until(
            lambda: [
                e for e in run.named("supervisor.status") if e["timestamp"] >= entered["timestamp"]
            ],
            deadline_s,
            what="a status line in the run phase",
        )
        run.signal(signal.SIGTERM)
        assert run.wait(deadline_s) == exitcodes.SIGNAL_BASE + signal.SIGTERM
    finally:
        run.kill()
    return set(out.read_text().split())


@pytest.mark.slow
def test_a_run_against_a_real_daemon_loads_no_simulator_nor_view_nor_nvml(tmp_path, manager):
    modules = loaded_by_run(tmp_path, manager().url)
    assert among(modules, ("cuzk_supervisor.lifecycle.machine", "grpc")) != []  # it did run
    assert among(modules, NEVER) == []
    assert among(modules, VIEW) == []
    assert among(modules, NVML) == []


@pytest.mark.slow
def test_a_local_run_without_the_health_server_loads_no_server_nor_metrics(tmp_path):
    modules = loaded_by_run(tmp_path, "", health_enabled="false")
    assert among(modules, ("cuzk_supervisor.lifecycle.machine",)) != []
    assert among(modules, (*NEVER, *VIEW, *NVML, *HEALTH_SERVER, "prometheus_client")) == []
