"""The daemon's pidfile, and daemons a previous supervisor left running.

A supervisor SIGKILLed while not PID 1 leaves its daemon running; the next one finds it by the
pidfile (pid and start time) or by its ``--config`` argument, and stops it before starting its
own (it would hold the port, the GPUs and the memory the new plan counts on).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import structlog

from cuzk_supervisor import killtree
from cuzk_supervisor.adapters import files
from cuzk_supervisor.daemon import leftovers
from cuzk_supervisor.daemon.spec import DaemonSettings

log = structlog.get_logger()


def pidfile_path(settings: DaemonSettings) -> Path:
    return settings.config_path.with_name("cuzk.pid")


def stale_daemons(settings: DaemonSettings) -> list[int]:
    """Daemons a previous supervisor left running: the one in our pidfile (if it is still that
    process), and any process started with our config file (a SIGKILL can land between the
    spawn and the pidfile write)."""
    found: set[int] = set()
    path = pidfile_path(settings)
    try:
        pid_text, started_text = files.read_regular(path, 4096).decode().split()
        if abs(psutil.Process(int(pid_text)).create_time() - float(started_text)) < 0.01:
            found.add(int(pid_text))
    except (OSError, ValueError, psutil.Error):
        pass
    config = str(settings.config_path)
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            ours = "--config" in cmdline and cmdline[cmdline.index("--config") + 1 :][:1] == [
                config
            ]
            if ours and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
    found.discard(os.getpid())
    return sorted(found)


def reclaim_stale_daemon(settings: DaemonSettings) -> None:
    """Stop a daemon a previous supervisor left running (it was SIGKILLed, not PID 1): it
    would hold the port, the GPUs and the memory the new plan counts on."""
    stale = stale_daemons(settings)
    if stale:
        log.warning("daemon.stale_reclaimed", pids=stale, config=str(settings.config_path))
        killtree.kill_tree(stale, settings.stop_grace_s)
    leftovers.forget(pidfile_path(settings))


def write_pidfile(settings: DaemonSettings, pid: int) -> None:
    """Record the daemon for the next supervisor; a failure is only a warning (the next one
    also finds it by its --config argument)."""
    path = pidfile_path(settings)
    try:
        started = psutil.Process(pid).create_time()
        files.atomic_write(path, f"{pid} {started}\n".encode(), files.FILE_MODE)
    except psutil.Error:
        pass  # already gone: nothing to record
    except OSError as exc:
        log.warning("daemon.pidfile_unwritable", path=str(path), reason=files.describe(exc))
