"""``cuzk-supervisor sim``: the whole lifecycle on a laptop, no GPU.

Starts the simulated manager, then runs exactly what ``run`` runs — register, params (a
simulated download), plan, warmup, restart, settle, bench, report, run — against the simulated
daemon in scaled time, printing each phase. Stays in the run phase until Ctrl-C, or exits there
with ``--exit-after-run``. Any ``run`` setting can be given too (e.g. ``--bench-count 6``).

The simulated machine (``--gpus``, ``--vram-gib``, ``--host-gib``, ``--memory-scale``) is known
to the plan from the start: its GPUs and their VRAM (below what a proof needs, the plan
refuses), and its RAM in simulated GiB. What the simulated daemon would refuse at its start
(``--sim-fault bogus``) is refused before anything starts, with exit 2. The GPUs' condition is
kept in SIM_DIR/gpus (the daemon's ``--gpu-dir``, read by the run phase's health watch through a
fake NVML), so a GPU fault (``--sim-fault gpu-lost:0,after_s=20``) is found, said in the
manager's ``setup`` tab, acted on and told as in the field; the watch's durations run at the
demo's pace (divided by the time scale). ``--fresh`` forgets the state, the manager's database
and the GPUs' condition.

With ``--manager-url URL`` it runs the same lifecycle against that manager (a real one, or a
``python -m cuzk_supervisor.sim.manager`` of your own) and starts no simulated manager.

The settings the demo sets itself (marked "sim: flag only" below: the label, min_rate, the
manager URL, the state, run and log folders, the daemon's binary, arguments, status address
and parameter cache, the C1 file, the GPU probe, the time and memory scales, the bench budget,
the params fetch and the health watch's durations) are taken from their flags only, never from
CUZK_SUPERVISOR_* variables or --config-file: an environment meant for the real instance (an
image's state folder, its manager URL and label) must not leak into the demo, nor the demo's
state into the real instance. Every other setting is read as ``run`` reads it: flag, then
environment, then file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cuzk_supervisor import settings
from cuzk_supervisor.adapters import files
from cuzk_supervisor.address import free_loopback_port
from cuzk_supervisor.cli import observe
from cuzk_supervisor.daemon.simulated import SIM_DAEMON_MODULE
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim.daemon.c1 import write_c1
from cuzk_supervisor.sim.machine import DEFAULT_VRAM_GIB, SimMachine, check_daemon_argv
from cuzk_supervisor.sim.machine.gpustate import FILE as GPU_FILE

# Simulated parameter files: small, but written at a pace that shows progress.
SIM_PARAMS = ("v28-porep-32g.params:40000000", "v28-porep-32g.vk:2000000")
# RAM enough for the most workers the plan allows (docs/daemon.md: 512+ → 12).
DEMO_HOST_GIB = 512.0
# The demo's label has the platform's form (C.<instance id>), so a manager's sweep can match it.
DEMO_LABEL = "C.100000001"
GPU_DIR = "gpus"  # in --sim-dir: the simulated GPUs' condition (the daemon's --gpu-dir)
# The health watch's durations, divided by the time scale as the daemon's are (_health_settings).
HEALTH_SCALED = (
    "health_interval_s",
    "health_gpu_lost_s",
    "health_failing_s",
    "health_stuck_min_s",
    "health_throttle_s",
    "health_exit_window_s",
    "health_restart_window_s",
)
DEMO_HEALTH_INTERVAL_MIN_S = 0.2  # real seconds, whatever the scale
DEMO_HEALTH_THRESHOLD_MIN_S = 1.0
"""No threshold of the demo's watch is shorter (real seconds): at time scale 400 the stuck
threshold would be 300 ms, and on a 2-core machine partitions that were not stuck stayed 300 to
500 ms in the GPU stage and were restarted as stuck ones."""
# The settings the demo sets itself (see _sim_settings), taken from their flags only.
SIM_OWNED = (
    "label",
    "min_rate",
    "manager_url",
    "state_dir",
    "run_dir",
    "log_dir",
    "daemon_binary",
    "daemon_args",
    "daemon_status_listen",
    "daemon_param_cache",
    "daemon_startup_deadline_s",
    "daemon_stop_grace_s",
    "c1_file",
    "gpu_probe",
    "rate_time_scale",
    "plan_memory_scale",
    "bench_budget_s",
    "status_interval_s",
    "await_deadline_s",
    "params_fetch_command",
    "params_expected",
    "params_progress_interval_s",
    *HEALTH_SCALED,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "sim",
        help="run the whole lifecycle against the simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim = parser.add_argument_group("simulator")
    sim.add_argument(
        "--sim-dir",
        type=Path,
        default=Path("run/sim"),
        help="folder for the simulator's state, logs, params and C1 (default run/sim)",
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        default=100.0,
        help="simulated seconds per real second (default 100)",
    )
    sim.add_argument(
        "--memory-scale", type=float, default=1.0, help="real MiB per simulated GiB (default 1)"
    )
    sim.add_argument("--gpus", type=int, default=1, metavar="N", help="simulated GPUs (default 1)")
    sim.add_argument(
        "--vram-gib",
        type=float,
        default=DEFAULT_VRAM_GIB,
        metavar="GIB",
        help=f"VRAM of each simulated GPU (default {DEFAULT_VRAM_GIB:g}; below the 12 GiB a "
        "proof needs, the plan refuses)",
    )
    sim.add_argument(
        "--host-gib",
        type=float,
        default=DEMO_HOST_GIB,
        metavar="GIB",
        help=f"simulated RAM the plan works from (default {DEMO_HOST_GIB:g})",
    )
    sim.add_argument(
        "--sim-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="a fault switch for the simulated daemon (docs/simulator.md)",
    )
    sim.add_argument(
        "--fetch-chatter",
        type=float,
        default=0.0,
        metavar="N",
        help="the simulated params fetch prints N progress lines a second (default 0)",
    )
    sim.add_argument(
        "--manager-fault",
        default="",
        metavar="K=V,...",
        help="fault switches for the simulated manager (e.g. fail_rate=0.3,html_rate=0.2; "
        "docs/sim-manager.md, 'Fault switches'); not with --manager-url",
    )
    sim.add_argument(
        "--fresh",
        action="store_true",
        help="forget the previous demo's state and manager database first",
    )
    settings.add_flags(parser)
    observe.add_view_flags(parser)
    _mark_flag_only(parser)
    parser.set_defaults(handler=main)


def _mark_flag_only(parser: argparse.ArgumentParser) -> None:
    declared = {decl.name: decl for decl in settings.declarations()}
    for action in parser._actions:
        decl = declared.get(action.dest)
        if decl is not None and decl.name in SIM_OWNED:
            action.help = (
                f"{decl.help} (sim: flag only, not ${decl.env} nor the settings file; "
                "default: the demo's own)"
            )


def _sim_settings(
    base: settings.Loaded, args: argparse.Namespace, sim_dir: Path, manager_url: str
) -> Settings:
    """The run settings pointed at the simulator; what the operator gave as a flag wins."""
    scale = args.time_scale
    daemon_args = [*_machine_args(args, sim_dir), "--time-scale", f"{scale:g}", *_faults(args)]
    overrides: dict[str, Any] = {
        "label": DEMO_LABEL,
        "min_rate": 30.0,
        "manager_url": manager_url,
        "state_dir": sim_dir / "state",
        "run_dir": sim_dir / "run",
        "log_dir": sim_dir / "log",
        "daemon_binary": sys.executable,
        "daemon_args": tuple(daemon_args),
        "daemon_status_listen": f"127.0.0.1:{free_loopback_port()}",
        "daemon_param_cache": sim_dir / "params",
        "daemon_startup_deadline_s": 60.0,
        "daemon_stop_grace_s": 5.0,
        "c1_file": sim_dir / "c1.json",
        "gpu_probe": "sim",
        "rate_time_scale": scale,
        "plan_memory_scale": 1024.0 / args.memory_scale,
        "bench_budget_s": 2700.0 / scale,
        "status_interval_s": 2.0,
        "await_deadline_s": 2.0,
        "params_fetch_command": f"{sys.executable} -m cuzk_supervisor.sim.fetch "
        + (f"--chatter {args.fetch_chatter:g} " if args.fetch_chatter > 0 else "")
        + " ".join(SIM_PARAMS),
        "params_expected": SIM_PARAMS,
        "params_progress_interval_s": 0.5,
        **_health_settings(scale),
    }
    # Not health_listen: read as in `run`, so that the image's HEALTHCHECK and `cuzk-supervisor
    # healthcheck` find it in both modes (two sims side by side pass --health-listen).
    # Only flags win: an environment meant for the real instance (an image's state folder, a
    # manager URL) must not leak into the demo, nor the demo's state into the real instance.
    chosen = {k: v for k, v in overrides.items() if base.sources.get(k) != "flag"}
    return dataclasses.replace(base.settings, **chosen)


def _health_settings(scale: float) -> dict[str, float]:
    """Each default divided by the time scale, with a floor: a GPU fault is found, said, acted on
    and told in seconds, as in the field in minutes."""
    declared = {decl.name: decl for decl in settings.declarations()}
    scaled = {}
    for name in HEALTH_SCALED:
        decl = declared[name]
        least = (
            DEMO_HEALTH_INTERVAL_MIN_S
            if name == "health_interval_s"
            else DEMO_HEALTH_THRESHOLD_MIN_S
        )
        scaled[name] = max(least, decl.minimum or 0.0, float(decl.default) / scale)
    return scaled


def _machine_args(args: argparse.Namespace, sim_dir: Path) -> list[str]:
    """``sim.machine`` reads the same arguments back for the supervisor's GPU probe and memory
    sampler, so the plan sees this machine from the start."""
    return [
        "-m", SIM_DAEMON_MODULE,
        "--gpus", str(args.gpus),
        "--vram-gib", f"{args.vram_gib:g}",
        "--host-gib", f"{args.host_gib:g}",
        "--memory-scale", f"{args.memory_scale:g}",
        "--cgroup-dir", str(sim_dir / "machine"),  # where it keeps memory.current
        "--gpu-dir", str(sim_dir / GPU_DIR),  # the GPUs' condition, the fake NVML's
    ]  # fmt: skip


def _faults(args: argparse.Namespace) -> list[str]:
    return [word for fault in args.sim_fault for word in ("--fault", fault)]


def _gpu_folder(folder: Path, *, fresh: bool) -> None:
    """Made ``files.DIR_MODE`` whatever the umask, a link or file planted there refused (never
    followed); ``fresh`` forgets the previous demo's condition (a lost GPU stays lost otherwise)."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, files.DIR_MODE)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, files.DIR_MODE)
            if fresh:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(GPU_FILE, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as exc:
        why = "a symbolic link (not followed)" if folder.is_symlink() else files.describe(exc)
        raise UsageError(f"the simulated GPUs' folder {folder}: {why}") from None


def _check_simulator(args: argparse.Namespace, sim_dir: Path) -> SimMachine:
    """What the simulated daemon would refuse at its start, refused before anything is made."""
    return check_daemon_argv([*_machine_args(args, sim_dir)[2:], *_faults(args)], os.environ)


def _start_manager(sim_dir: Path, faults: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_SIM_MANAGER_")}
    if faults:
        env["CUZK_SIM_MANAGER_FAULTS"] = faults
    proc = subprocess.Popen(
        [sys.executable, "-m", "cuzk_supervisor.sim.manager", "--db", str(sim_dir / "manager.db"),
         "--listen", f"127.0.0.1:{port}", "--check-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline().decode(errors="replace")
            if "listening on" in line:
                return proc, line.split("listening on", 1)[1].strip()
            if not line:
                break
    proc.kill()
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr is not None else ""
    raise UsageError(f"the simulated manager did not start: {stderr[-500:]}")


def main(args: argparse.Namespace) -> int:
    base = settings.from_namespace(args)
    if not (args.time_scale > 0 and args.memory_scale > 0):
        raise UsageError("--time-scale and --memory-scale must be > 0")
    external = base.sources.get("manager_url") == "flag" and bool(base.settings.manager_url)
    if external and args.manager_fault:
        raise UsageError(
            "--manager-fault switches the simulated manager's faults; with --manager-url no "
            "simulated manager is started (give the faults to that manager instead)"
        )
    sim_dir = args.sim_dir.resolve()
    machine = _check_simulator(args, sim_dir)
    if args.fresh:
        for stale in (sim_dir / "state" / "state.json", sim_dir / "manager.db"):
            stale.unlink(missing_ok=True)
    sim_dir.mkdir(parents=True, exist_ok=True)
    _gpu_folder(sim_dir / GPU_DIR, fresh=args.fresh)
    c1 = sim_dir / "c1.json"
    if not c1.exists():
        write_c1(c1, size_bytes=1_000_000)  # the real 51 MB only slows the demo
    # The simulated RAM starts empty (a daemon killed earlier left its last figure there).
    (sim_dir / "machine").mkdir(exist_ok=True)
    (sim_dir / "machine" / "memory.current").write_text("0\n")
    manager: subprocess.Popen[bytes] | None = None
    if external:
        url, origin = base.settings.manager_url, "given by --manager-url, none simulated"
    else:
        manager, url = _start_manager(sim_dir, args.manager_fault)
        origin = "simulated"
    try:
        s = _sim_settings(base, args, sim_dir, url)
        print(
            f"sim: manager {settings.redact_url(url)} ({origin}), state {s.state_dir}, "
            f"daemon log {s.log_dir / 'cuzk.log'}\n"
            f"sim: machine {machine.describe()}, {args.time_scale:g} simulated s per real s",
            flush=True,
        )
        # The lifecycle (gRPC, the manager client, the health server) only now, not for --help.
        from cuzk_supervisor.cli.runlifecycle import run_lifecycle
        from cuzk_supervisor.sim.machine.probes import machine as sim_machine

        started = time.monotonic()
        code = run_lifecycle(
            s, os.environ, sim_machine(os.environ),
            on_phase=lambda phase: None if observe.view_shown() else print(
                f"sim: {time.monotonic() - started:6.1f}s  phase {phase}", flush=True
            ),
            command="sim", verbose=args.verbose,
            keep_children=() if manager is None else (manager.pid,),
        )  # fmt: skip
        if not observe.view_shown():  # the terminal view ended with its own summary
            print(f"sim: finished with exit code {code} after {time.monotonic() - started:.1f}s")
        return code
    finally:
        if manager is not None:
            manager.terminate()
            try:
                manager.wait(10)
            except subprocess.TimeoutExpired:
                manager.kill()
