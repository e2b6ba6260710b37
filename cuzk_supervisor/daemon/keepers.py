"""The keepers as the settings make them: the one place a ``DaemonKeeper`` is built from them.

``daemon_keeper`` is the daemon's (the ``daemon`` command's, and the lifecycle's daemon control's,
``lifecycle.daemonctl``): how to run it (``settings.policies.daemon_settings``), its restart
policy, its config values (``config_values``: a plan's workers and budget with the settings'
addresses, parameter cache and log level) and its process, spawned through the caller's
spawner (the runtime's reaper). ``worker_keeper`` keeps a worker command up beside it in the run
phase, under the same restart policy. The fleet bench builds its virtual machines' keepers here
too, so that what it measures is the product's wiring, not a copy of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cuzk_supervisor.core.restart import RestartPolicy
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.keeper import DaemonKeeper
from cuzk_supervisor.daemon.output import LineSink
from cuzk_supervisor.daemon.process import DaemonProcess, Spawner
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import daemon_listen, daemon_settings, policy


def config_values(
    s: Settings, *, partition_workers: int, total_budget_gib: int, max_parallel_synthesis: int
) -> DaemonConfigValues:
    """The daemon's config values: a plan's workers and budget, the rest from the settings."""
    return DaemonConfigValues(
        partition_workers=partition_workers,
        total_budget_gib=total_budget_gib,
        max_parallel_synthesis=max_parallel_synthesis,
        listen=daemon_listen(s),
        status_listen=s.daemon_status_listen,
        param_cache=str(s.daemon_param_cache),
        log_level=s.daemon_log_level,
    )


def daemon_keeper(
    s: Settings,
    values: DaemonConfigValues,
    *,
    spawn: Spawner,
    cgroup_dir: Path | None,
    memory_at_limit: Callable[[], bool] | None = None,
    line_sinks: Sequence[LineSink] = (),
) -> DaemonKeeper:
    """The daemon's keeper: started with ``values``, each process spawned with ``spawn``;
    ``memory_at_limit`` tells an exit at the memory limit apart (the lifecycle's memory watch),
    ``line_sinks`` get each line of its output (the log shipper)."""
    extra: dict[str, Any] = {} if memory_at_limit is None else {"memory_at_limit": memory_at_limit}
    factory = functools.partial(DaemonProcess, spawn=spawn, line_sinks=tuple(line_sinks), **extra)
    return DaemonKeeper(
        daemon_settings(s, cgroup_dir), values, policy(RestartPolicy, s), process_factory=factory
    )


def worker_keeper(
    s: Settings,
    daemon: DaemonKeeper,
    command: str,
    *,
    source: str,
    spawn: Spawner,
    line_sink: LineSink,
) -> DaemonKeeper:
    """A worker command (``worker_commands``) kept up beside ``daemon`` under the same restart
    policy, its output's lines to ``line_sink`` (the tab ``source``), its pid file in the
    state folder."""
    from cuzk_supervisor.daemon.workers import CommandProcess

    def factory(*_: object) -> CommandProcess:
        return CommandProcess(
            command,
            source=source,
            stop_grace_s=s.daemon_stop_grace_s,
            spawn=spawn,
            line_sink=line_sink,
            pid_dir=s.state_dir,
        )

    return DaemonKeeper(
        daemon.settings, daemon.values, policy(RestartPolicy, s), process_factory=factory,
        name=source,
    )  # fmt: skip
