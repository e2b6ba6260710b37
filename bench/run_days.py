"""Days of the run phase, compressed: the supervisor's RSS, open descriptors and threads over
days of its run-phase ticks, with the daemon restarted every few simulated minutes (issue 44).

    .venv/bin/python bench/run_days.py [--duration-s 3600] [--cadence 100]
                                       [--restart-every-s 300] [--json FILE] [--quick]

One ``supervisor run`` against the simulated manager and daemon (real processes on loopback)
goes through its lifecycle at the simulator's quick time scale, then stays in the run phase
for ``--duration-s`` of wall time with every periodic interval of the run phase divided by
``--cadence`` (the memory watch's samples, the health watch, the liveness probe, the status
line, the ``/running`` ping, the log pushes, and the windows they count in: ``CADENCED``): at
100x an hour of wall time is about four days of ticks. The health watch reads the simulated
GPUs (``gpu_probe`` sim, the daemon's ``--gpu-dir``). Every ``--restart-every-s`` simulated
seconds the bench SIGKILLs the daemon and the supervisor restarts it.

The supervisor's RSS, open fds and threads are sampled every second; after a warm-up the floor
of the last window is held against the floor of the first (``_days``): at most 2 MiB of RSS
growth over four simulated days, scaled to the days measured, and no growth in fds or threads.
Prints a table, the notes and the JSON rows; exit 0 when every target is met, 1 when a figure
could not be measured, 3 when a target is missed (the bench/ convention). ``--quick``: 20 s,
sampled every 0.1 s, every row measured and none judged: 5-s windows cannot tell a pool's
threads being started (the asyncio executor's, under load) from growth.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import _days
import _settings as cfg
import psutil
from _harness import (
    QUICK_TIME_SCALE,
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    compile_package,
    failed,
    progress_printer,
    report,
    standard_options,
    unheld,
    within,
)

from cuzk_supervisor.settings import Settings

CADENCED = (
    "memory_sample_interval_s", "memory_alert_sample_interval_s", "status_interval_s",
    "running_ping_interval_s", "log_push_interval_s", "daemon_liveness_interval_s",
    "daemon_liveness_timeout_s", "health_interval_s", "health_exit_window_s",
    "health_restart_window_s", "restart_backoff_initial_s", "restart_backoff_max_s",
    "restart_stable_after_s", "crash_loop_window_s",
)  # fmt: skip
"""The run phase's periodic intervals (and the windows and delays that go with them), each its
product default divided by the cadence (never under the setting's minimum)."""
SAMPLE_EVERY_S = 1.0
QUICK_SAMPLE_EVERY_S = 0.1
"""A quick run's windows are 5 s: sampled this often, each still holds a few restarts' worth
of samples (its rows are shown, not judged)."""
QUICK_DURATION_S = 20.0

progress = progress_printer("days")


def cadenced(cadence: float) -> tuple[dict[str, float], list[str]]:
    """The settings of ``CADENCED`` at ``cadence`` times their default, and the ones held at
    their minimum instead."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    values: dict[str, float] = {}
    held: list[str] = []
    for name in CADENCED:
        f = fields[name]
        value = float(f.default) / cadence  # type: ignore[arg-type]
        least = f.metadata.get("minimum")
        if least is not None and value < least:
            value = float(least)
            held.append(f"{name} {value:g}")
        values[name] = round(value, 6)
    return values, held


def environment(root: Path, manager_url: str, cadence: float) -> tuple[dict[str, str], list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    env = cfg.lifecycle(root, manager_url, QUICK_TIME_SCALE, cfg.QUICK_MEMORY_SCALE)
    values, held = cadenced(cadence)
    gpus = root / "gpus"
    gpus.mkdir(parents=True, exist_ok=True)
    env.update(cfg.to_env({**values, "gpu_probe": "sim", "exit_after_run": "false",
                           # The bench's own kills are no sick daemon: the watch says so and
                           # acts no further (it would tell the manager, which ends the run),
                           # and a kill every few seconds is no crash loop to give up on.
                           "health_ladder": "say", "crash_loop_failures": 1000}))  # fmt: skip
    env["CUZK_SUPERVISOR_DAEMON_ARGS"] += f" --gpu-dir {shlex.quote(str(gpus))}"
    return env, held


def daemon_pid(sup: SupervisorProc) -> int | None:
    """The daemon the supervisor started last, while it runs."""
    spawned = sup.named("daemon.spawned")
    if not spawned:
        return None
    pid = int(spawned[-1]["pid"])
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE and proc.ppid() == sup.pid:
            return pid
    return None


def hold(
    sup: SupervisorProc, duration_s: float, restart_wall_s: float, every_s: float
) -> tuple[list[_days.Sample], int]:
    """Sample the supervisor every ``every_s`` for ``duration_s``; kill its daemon every
    ``restart_wall_s``."""
    proc = psutil.Process(sup.pid)
    samples: list[_days.Sample] = []
    restarts = 0
    t0 = time.monotonic()
    next_kill = t0 + restart_wall_s
    next_sample = t0
    last_note = t0
    while (now := time.monotonic()) < t0 + duration_s:
        if sup.proc.poll() is not None:
            raise BenchError(f"the supervisor exited (rc {sup.proc.returncode}) after "
                             f"{now - t0:.0f} s")  # fmt: skip
        if now >= next_sample:
            with proc.oneshot():
                samples.append(_days.Sample(now - t0, proc.memory_info().rss, proc.num_fds(),
                                            proc.num_threads()))  # fmt: skip
            next_sample += every_s
        if now >= next_kill:
            pid = daemon_pid(sup)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    restarts += 1
            next_kill += restart_wall_s
        if now - last_note >= 60:
            s = samples[-1]
            progress(f"{now - t0:.0f} s: RSS {s.rss / _days.MIB:.2f} MiB, {s.fds} fds, "
                     f"{s.threads} threads, {restarts} restarts")  # fmt: skip
            last_note = now
        time.sleep(max(0.0, min(next_sample, next_kill) - time.monotonic()))
    return samples, restarts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration-s", type=within(60, 7 * 86_400), default=3600.0,
                   help="wall seconds held in the run phase (60 s to 7 days; default 3600: "
                   "about four simulated days at 100x)")  # fmt: skip
    p.add_argument("--cadence", type=within(1, 1000), default=100.0,
                   help="how many times faster than their defaults the run phase's intervals "
                   "tick (1-1000, default 100)")  # fmt: skip
    p.add_argument(
        "--restart-every-s",
        type=within(60, 86_400),
        default=300.0,
        help="simulated seconds between two daemon kills (60-86400, default 300)",
    )
    standard_options(p, f"{QUICK_DURATION_S:g} s held")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    duration = QUICK_DURATION_S if args.quick else args.duration_s
    restart_wall_s = args.restart_every_s / args.cadence
    compile_package()
    root = Path(tempfile.mkdtemp(prefix="cuzk-days-"))
    procs = Processes(str(root))
    notes: list[str] = []
    rows: list[Row]
    try:
        manager = Manager(procs, root / "manager.db")
        env, held = environment(root / "sup", manager.url, args.cadence)
        progress("supervisor run: the lifecycle, to the run phase ...")
        sup = SupervisorProc(procs, "run", env)
        sup.wait_event("health.watching", 300)
        progress(f"run phase: held {duration:g} s, the daemon killed every {restart_wall_s:g} s")
        every = QUICK_SAMPLE_EVERY_S if args.quick else SAMPLE_EVERY_S
        samples, restarts = hold(sup, duration, restart_wall_s, every)
        win = _days.windows_for(duration)
        rows = _days.rows(samples, win, args.cadence, restarts)
        if args.quick:  # see the module's docstring
            rows = [unheld(r) if r.ok is not None else r for r in rows]
        exits = len(sup.named("daemon.exited"))
        cadence_text = ", ".join(f"{k}={v:g}" for k, v in cadenced(args.cadence)[0].items())
        notes += [
            f"cadence {args.cadence:g}x: {cadence_text}"
            + (f"; held at the minimum: {', '.join(held)}" if held else ""),
            f"warm-up {win.warm_s:.0f} s, windows of {win.window_s:.0f} s; a floor is the least"
            " sample in its window (a restart's brief fds and threads are a sawtooth above it)",
            f"RSS target scaled: 2 MiB x {(win.last[1] - win.first[0]) * args.cadence / 86400:.2f}"
            " simulated days / 4",
            f"daemon.exited events: {exits}; supervisor pid {sup.pid}; sampled every "
            f"{every:g} s ({len(samples)} samples)",
        ]
        sup.stop()
    except BenchError as exc:
        rows = [failed("run days", "", "", str(exc))]
    finally:
        procs.close()
        if procs.leftovers:
            notes.append("LEFT BEHIND (killed by the bench): " + "; ".join(procs.leftovers))
        shutil.rmtree(root, ignore_errors=True)
    return report(rows, notes, args.json, args.quick)


if __name__ == "__main__":
    sys.exit(main())
