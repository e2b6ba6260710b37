"""Helpers for tests that run the supervisor around the simulated daemon.

``sim_settings`` points ``DaemonSettings`` at ``python -m cuzk_supervisor.sim.daemon``;
``Supervisor``
runs ``cuzk-supervisor daemon`` as a real subprocess (signals matter there) and collects its JSON
log events from stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil
from pacehelpers import patient, scaled
from simhelpers import free_tcp_port, poll_until

from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.process import DaemonSettings

SIM_MODULE = ("-m", "cuzk_supervisor.sim.daemon")


def sim_args(
    faults: Iterable[str] = (), time_scale: float | None = None, extra: Iterable[str] = ()
) -> tuple[str, ...]:
    """The simulated daemon's arguments; ``time_scale`` by default 100 on the reference machine
    (slower on a slow one: pacehelpers)."""
    scale = scaled(100.0) if time_scale is None else time_scale
    args = [*SIM_MODULE, "--time-scale", f"{scale:g}", *extra]
    for fault in faults:
        args += ["--fault", fault]
    return tuple(args)


def sim_settings(tmp_path: Path, faults: Iterable[str] = (), **overrides: Any) -> DaemonSettings:
    fields: dict[str, Any] = {
        "binary": sys.executable,
        "extra_args": sim_args(faults),
        "config_path": tmp_path / "run" / "cuzk.toml",
        "log_path": tmp_path / "run" / "cuzk.log",
        "startup_deadline_s": 30.0,
        "stop_grace_s": 3.0,
    }
    fields.update(overrides)
    return DaemonSettings(**fields)


def sim_values(tmp_path: Path, workers: int = 2, **overrides: Any) -> DaemonConfigValues:
    fields: dict[str, Any] = {
        "partition_workers": workers,
        "total_budget_gib": 69 + 20 * workers,
        "max_parallel_synthesis": workers,
        "listen": f"127.0.0.1:{free_tcp_port()}",
        "status_listen": f"127.0.0.1:{free_tcp_port()}",
        "param_cache": str(tmp_path / "params"),
    }
    fields.update(overrides)
    return DaemonConfigValues(**fields)


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (e.g. a test's tmp_path)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


# Every Supervisor started by the running test, so that a failed test's report can show what
# each one printed and how it ended (see conftest.py).
STARTED: list[Supervisor] = []


class Supervisor:
    """``cuzk-supervisor COMMAND …`` as a subprocess; JSON events from stderr in ``events``."""

    def __init__(
        self,
        args: Sequence[str],
        prefix: Sequence[str] = (),
        command: str = "daemon",
        env: dict[str, str] | None = None,
    ) -> None:
        argv = [*prefix, sys.executable, "-m", "cuzk_supervisor", command, *args]
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CUZK_SIM_", "CUZK_SUPERVISOR_", "VAST_", "MIN_RATE"))
        }
        env = {**base, **(env or {})}
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.events: list[dict[str, Any]] = []
        self.plain_lines: list[str] = []
        self.raw_lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        STARTED.append(self)

    def describe(self, tail: int = 60) -> str:
        """Exit status and the last ``tail`` stderr lines, for a failed test's report."""
        code = self.proc.poll()
        status = "still running" if code is None else f"exit code {code}"
        with self._lock:
            lines = self.raw_lines[-tail:]
        return f"{' '.join(self.argv)}\n{status}\n" + "\n".join(lines)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.raw_lines.append(line)
                try:
                    self.events.append(json.loads(line))
                except json.JSONDecodeError:
                    self.plain_lines.append(line)

    def phases(self) -> list[str]:
        return [e["phase"] for e in self.named("phase.entered")]

    def stderr_text(self) -> str:
        with self._lock:
            return "\n".join(self.raw_lines)

    def named(self, event: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == event]

    def wait_event(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        return poll_until(lambda: self.named(event), timeout, what=f"event {event}")[0]

    def daemon_pid(self) -> int:
        return int(self.wait_event("daemon.spawned")["pid"])

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(patient(timeout))
        self._reader.join(patient(timeout))
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def absent(pid: int) -> bool:
    """Not even a zombie: fully reaped."""
    return not Path(f"/proc/{pid}").exists()
