"""The keepers as the settings make them: the one place a ``DaemonKeeper`` is built.

``KeeperRecipe`` is what the settings say about them (``settings.policies.keeper_recipe`` makes
it). ``daemon_keeper`` is the daemon's (the ``daemon`` command's, and ``lifecycle.daemonctl``'s),
its process spawned through the caller's spawner (the runtime's reaper); ``worker_keeper`` keeps a
worker command up beside it in the run phase, under the same restart policy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzk_supervisor.core.restart import RestartPolicy
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.keeper import DaemonKeeper
from cuzk_supervisor.daemon.output import LineSink
from cuzk_supervisor.daemon.process import DaemonProcess, Spawner
from cuzk_supervisor.daemon.spec import DaemonSettings


@dataclass(frozen=True)
class KeeperRecipe:
    """What the settings say about the daemon's keepers: how to run the daemon, its restart
    policy, the config's addresses, parameter cache and log level, the worker commands."""

    spec: DaemonSettings
    restart: RestartPolicy
    listen: str
    status_listen: str
    param_cache: Path
    log_level: str
    worker_commands: tuple[str, ...]
    pid_dir: Path
    """Where a worker command's pid file goes (the state folder)."""


def config_values(
    recipe: KeeperRecipe,
    *,
    partition_workers: int,
    total_budget_gib: int,
    max_parallel_synthesis: int,
) -> DaemonConfigValues:
    """The daemon's config values: a plan's workers and budget, the rest from the recipe."""
    return DaemonConfigValues(
        partition_workers=partition_workers, total_budget_gib=total_budget_gib,
        max_parallel_synthesis=max_parallel_synthesis, listen=recipe.listen,
        status_listen=recipe.status_listen, param_cache=str(recipe.param_cache),
        log_level=recipe.log_level,
    )  # fmt: skip


def daemon_keeper(
    recipe: KeeperRecipe,
    values: DaemonConfigValues,
    *,
    spawn: Spawner,
    memory_at_limit: Callable[[], bool] | None = None,
    line_sinks: Sequence[LineSink] = (),
) -> DaemonKeeper:
    """The daemon's keeper, started with ``values``; ``memory_at_limit`` tells an exit at the
    memory limit apart (the memory watch), ``line_sinks`` get each line of its output."""
    extra: dict[str, Any] = {} if memory_at_limit is None else {"memory_at_limit": memory_at_limit}
    factory = functools.partial(DaemonProcess, spawn=spawn, line_sinks=tuple(line_sinks), **extra)
    return DaemonKeeper(recipe.spec, values, recipe.restart, process_factory=factory)


def worker_keeper(
    recipe: KeeperRecipe,
    daemon: DaemonKeeper,
    command: str,
    *,
    source: str,
    spawn: Spawner,
    line_sink: LineSink,
) -> DaemonKeeper:
    """A worker command kept up beside ``daemon``, its lines to ``line_sink`` (the tab
    ``source``), its pid file in the state folder."""
    from cuzk_supervisor.daemon.workers import CommandProcess

    def factory(*_: object) -> CommandProcess:
        return CommandProcess(
            command, source=source, stop_grace_s=recipe.spec.stop_grace_s, spawn=spawn,
            line_sink=line_sink, pid_dir=recipe.pid_dir,
        )  # fmt: skip

    return DaemonKeeper(daemon.spec, daemon.values, recipe.restart, process_factory=factory,
                        name=source)  # fmt: skip
