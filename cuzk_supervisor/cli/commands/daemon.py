"""``cuzk-supervisor daemon --workers W``: keep only the daemon up, as a supervised child.

Renders its config, starts it in its own process group, carries its output, restarts it with
backoff when it dies, and stops with a crash-loop verdict when it keeps dying. SIGTERM, SIGINT,
SIGHUP and SIGQUIT stop it (SIGTERM, grace, SIGKILL) and exit 128 + signal. Takes the settings
of the daemon, its supervision, the supervisor's log, its run and log folders and the memory
plan (which checks ``--workers`` against the memory limit); ``--workers`` is required here.
"""

from __future__ import annotations

import argparse
import functools
import sys

from cuzk_supervisor import settings
from cuzk_supervisor.cli.observe import configure_logging
from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import PlanRefusal, plan_workers
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.keepers import KeeperRecipe, config_values, daemon_keeper
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.runtime import Runtime, run_supervised
from cuzk_supervisor.settings.policies import keeper_recipe, policy

# Settings of those groups the daemon command does not read: no OOM step-down (that is the
# lifecycle's), no GPU probe (the plan here is a check of --workers against memory only).
DAEMON_UNUSED = ("proactive_oom", "gpu_probe")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "daemon", help="keep only the daemon up as a supervised child", description=__doc__
    )
    settings.add_flags(
        parser,
        ["logging", "daemon", "supervision", "memory"],
        names=("run_dir", "log_dir"),
        without=DAEMON_UNUSED,
    )
    workers = next(a for a in parser._actions if a.dest == "workers")
    workers.help = (
        "partition_workers the daemon runs with, checked against the memory limit (required "
        f"here: 1-256, no default; env: {settings.ENV_PREFIX}WORKERS)"
    )
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from cuzk_supervisor.cli.simhandoff import machine_for  # not for --help: it loads the sim

    s = settings.from_namespace(args).settings
    if s.workers < 1:
        raise UsageError("--workers is required (partition_workers for the daemon)")
    json_logs = {"auto": None, "json": True, "console": False}[s.log_format]
    configure_logging(s.log_level, json=json_logs)
    sampler = machine_for(s).memory_sampler(s)
    snapshot = sampler.sample()
    plan = plan_workers(
        PlanInputs(
            host_total_bytes=snapshot.host_total,
            cgroup_limit_bytes=snapshot.cgroup_limit,
            workers_override=s.workers,
            memory_scale=s.plan_memory_scale,
        ),
        policy(MemoryPolicy, s),
    )
    if isinstance(plan, PlanRefusal):
        raise UsageError(f"cannot plan {s.workers} workers: {plan.reason}")
    recipe = keeper_recipe(s, sampler.cgroup.dir if sampler.cgroup else None)
    values = config_values(recipe, **plan.config_values())
    return run_supervised(
        functools.partial(_keep, recipe, values), cleanup_grace_s=s.daemon_stop_grace_s
    )


async def _keep(recipe: KeeperRecipe, values: DaemonConfigValues, rt: Runtime) -> int:
    keeper = daemon_keeper(recipe, values, spawn=rt.reaper.spawn)
    outcome = await keeper.run()
    if outcome.exit_code:
        # One plain line for whoever reads the container's output, beside the JSON events.
        print(f"cuzk-supervisor daemon: {outcome.reason}", file=sys.stderr)
    return outcome.exit_code
