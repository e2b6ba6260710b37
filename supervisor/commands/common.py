"""Command-line options shared by the commands that run the daemon (``daemon``, ``sim``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.daemon import DaemonSettings
from supervisor.errors import UsageError
from supervisor.policy import RestartPolicy


def add_daemon_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("daemon process")
    group.add_argument("--binary", default="cuzk", help="daemon binary (default: cuzk on PATH)")
    group.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument put before the daemon's own flags (repeatable)",
    )
    group.add_argument(
        "--config-path",
        type=Path,
        default=Path("/run/cuzk-supervisor/cuzk.toml"),
        help="where the rendered daemon config is written",
    )
    group.add_argument(
        "--base-config",
        type=Path,
        default=None,
        help="operator's daemon config to merge (our keys win)",
    )
    group.add_argument(
        "--daemon-log",
        type=Path,
        default=Path("/var/log/cuzk-supervisor/cuzk.log"),
        help="rotating file that keeps every daemon output line",
    )
    group.add_argument(
        "--startup-deadline",
        type=float,
        default=900.0,
        metavar="S",
        help="seconds the daemon may take to answer GetStatus (default 900)",
    )
    group.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping it (default 10)",
    )
    group.add_argument(
        "--cgroup-dir",
        type=Path,
        default=None,
        help="memory cgroup folder whose oom_kill counter identifies OOM kills",
    )
    restart = parser.add_argument_group("restart policy")
    restart.add_argument("--backoff-initial", type=float, default=1.0, metavar="S")
    restart.add_argument("--backoff-max", type=float, default=60.0, metavar="S")
    restart.add_argument(
        "--stable-after",
        type=float,
        default=600.0,
        metavar="S",
        help="healthy this long resets the backoff (default 600)",
    )
    restart.add_argument("--crash-loop-failures", type=int, default=5, metavar="N")
    restart.add_argument("--crash-loop-window", type=float, default=300.0, metavar="S")


def daemon_settings(args: argparse.Namespace) -> DaemonSettings:
    if args.startup_deadline <= 0 or args.stop_grace < 0:
        raise UsageError("--startup-deadline must be > 0 and --stop-grace >= 0")
    return DaemonSettings(
        binary=args.binary,
        extra_args=tuple(args.daemon_arg),
        config_path=args.config_path,
        base_config=args.base_config,
        log_path=args.daemon_log,
        startup_deadline_s=args.startup_deadline,
        stop_grace_s=args.stop_grace,
        cgroup_dir=args.cgroup_dir,
    )


def restart_policy(args: argparse.Namespace) -> RestartPolicy:
    try:
        return RestartPolicy(
            initial_backoff_s=args.backoff_initial,
            max_backoff_s=args.backoff_max,
            stable_after_s=args.stable_after,
            crash_loop_failures=args.crash_loop_failures,
            crash_loop_window_s=args.crash_loop_window,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
