"""``cuzk-supervisor daemon``: keep the daemon up as a supervised child until a signal.

Renders its config from the given workers, starts it in its own process group, carries its
output, restarts it with backoff when it dies, and stops with a crash-loop verdict when it keeps
dying. SIGTERM/SIGINT/SIGHUP/SIGQUIT stop it (SIGTERM, grace, SIGKILL) and exit 128 + signal.
"""

from __future__ import annotations

import argparse
import functools
import sys

from supervisor.commands.common import add_daemon_options, daemon_settings, restart_policy
from supervisor.daemon import DaemonProcess, DaemonSettings
from supervisor.daemon_config import DaemonConfigValues
from supervisor.observe import configure_logging
from supervisor.policy import RestartPolicy
from supervisor.runtime import Runtime, run_supervised
from supervisor.supervision import DaemonKeeper


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "daemon", help="run the daemon as a supervised child until a signal", description=__doc__
    )
    parser.add_argument("--workers", type=int, required=True, help="partition_workers")
    parser.add_argument(
        "--budget-gib",
        type=int,
        default=None,
        help="total_budget in GiB (default 69 + 20 x workers)",
    )
    parser.add_argument(
        "--listen",
        default="unix:///run/cuzk-supervisor/cuzk.sock",
        help="daemon gRPC address: ip:port or unix:///path (never 0.0.0.0)",
    )
    parser.add_argument(
        "--status-listen", default="127.0.0.1:9821", help="daemon's HTTP /status address"
    )
    parser.add_argument("--param-cache", default="/data/zk/params")
    parser.add_argument("--daemon-log-level", default="info")
    parser.add_argument("--log-level", default="info", help="supervisor log level")
    add_daemon_options(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    values = DaemonConfigValues(
        partition_workers=args.workers,
        total_budget_gib=args.budget_gib or 69 + 20 * args.workers,
        max_parallel_synthesis=args.workers,
        listen=args.listen,
        status_listen=args.status_listen,
        param_cache=args.param_cache,
        log_level=args.daemon_log_level,
    )
    settings = daemon_settings(args)
    policy = restart_policy(args)
    return run_supervised(functools.partial(_keep, settings, values, policy))


async def _keep(
    settings: DaemonSettings, values: DaemonConfigValues, policy: RestartPolicy, rt: Runtime
) -> int:
    keeper = DaemonKeeper(
        settings,
        values,
        policy,
        process_factory=functools.partial(DaemonProcess, spawn=rt.reaper.spawn),
    )
    outcome = await keeper.run()
    if outcome.exit_code:
        # One plain line for whoever reads the container's output, beside the JSON events.
        print(f"cuzk-supervisor daemon: {outcome.reason}", file=sys.stderr)
    return outcome.exit_code
