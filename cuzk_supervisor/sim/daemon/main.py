"""``python -m cuzk_supervisor.sim.daemon``: the simulated cuzk daemon process (docs/simulator.md).

Start-up order follows the real daemon: "starting", engine, (workers release) SRS and PCE
loads, the "ready" line, and only then, on TCP, the bind. Signals: SIGINT stops the workers
and nothing else; SIGTERM is deliberately left at its default action (die at once), so no
handler is installed for it anywhere. A bind failure is an error line and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import grpc

from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.daemon import chaos, logfmt, model, statusdoc
from cuzk_supervisor.sim.daemon.chaos import FaultController, HangGate
from cuzk_supervisor.sim.daemon.config import DEFAULT_CONFIG, ConfigError, SimConfig, load_config
from cuzk_supervisor.sim.daemon.engine import Engine
from cuzk_supervisor.sim.daemon.engineevents import GpuSteps
from cuzk_supervisor.sim.daemon.memory import Memory
from cuzk_supervisor.sim.daemon.service import ProvingService, start_grpc_server
from cuzk_supervisor.sim.daemon.status_http import start_status_server
from cuzk_supervisor.sim.daemon.timeline import Timeline
from cuzk_supervisor.sim.daemon.transport import (
    CallRules,
    Proxy,
    private_target,
    remove_stale_socket,
)
from cuzk_supervisor.sim.faults import FaultSpec, FaultSpecError, parse_faults
from cuzk_supervisor.sim.machine import SimMachine, add_machine_arguments
from cuzk_supervisor.sim.machine.gpustate import GpuState

VERSION = "0.1.0-sim"
TARGET = "cuzk_daemon"
# Test knob: how long after the "ready" line the TCP port is bound (real ms, not scaled).
BIND_DELAY_ENV = "CUZK_SIM_BIND_DELAY_MS"
DEFAULT_BIND_DELAY_MS = 75.0


def _first_proof_factor(args: argparse.Namespace) -> float:
    marker: Path | None = args.first_proof_factor_after
    if marker is None:
        return float(args.first_proof_factor)
    try:
        marker.open("x").close()  # the first start: remember it, keep the ordinary factor
    except FileExistsError:
        return float(args.first_proof_factor)
    return model.FIRST_PROOF_AFTER_START_FACTOR


def _env_default(name: str, default: str) -> str:
    return os.environ.get(name) or default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cuzk_supervisor.sim.daemon",
        description="Simulated cuzk proving daemon (see docs/simulator.md).",
    )
    p.add_argument("-c", "--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("-l", "--listen", default=None, help="ip:port or unix:///path")
    p.add_argument("--log-level", default=None, help="error|warn|info|debug|trace")
    p.add_argument(
        "--time-scale",
        type=float,
        default=_env_default("CUZK_SIM_TIME_SCALE", "100"),  # argparse applies `type` to it
        help="simulated seconds per real second",
    )
    p.add_argument(
        "--release",
        choices=("workers", "budget"),
        default=_env_default("CUZK_SIM_RELEASE", "workers"),
    )
    add_machine_arguments(p)  # --memory-scale --gpus --vram-gib --host-gib --cgroup-dir
    p.add_argument("--fault", action="append", default=[], metavar="SPEC")
    p.add_argument(
        "--first-proof-factor",
        type=float,
        default=_env_default(
            "CUZK_SIM_FIRST_PROOF_FACTOR", str(model.FIRST_PROOF_AFTER_START_FACTOR)
        ),
        help="synthesis of the first proof after each start takes this many times longer "
        "(incident I3; 10 makes the settle proof ten times slower than a steady one)",
    )
    p.add_argument(
        "--first-proof-factor-after",
        type=Path,
        default=os.environ.get("CUZK_SIM_FIRST_PROOF_FACTOR_AFTER") or None,
        metavar="MARKER",
        help="apply --first-proof-factor only to starts after the first: the first start creates "
        "MARKER (an absolute path) and keeps the default factor",
    )
    p.add_argument(
        "--synthesis-factor",
        type=float,
        default=_env_default("CUZK_SIM_SYNTHESIS_FACTOR", "1"),
        metavar="F",
        help="every partition synthesizes F times slower (F > 1: the pipeline is "
        "synthesis-bound with more partitions waiting for the limiter)",
    )
    p.add_argument(
        "--gpu-factor",
        type=float,
        default=_env_default("CUZK_SIM_GPU_FACTOR", "1"),
        metavar="F",
        help="every partition's CUDA work takes F times longer (a slower GPU; 8: GPU-bound at "
        "5 partition workers on one GPU)",
    )
    p.add_argument(
        "--gpu-cpu-factor",
        type=float,
        default=_env_default("CUZK_SIM_GPU_CPU_FACTOR", "1"),
        metavar="F",
        help="the CPU parts of every partition's GPU stage (its preparation and finalization) "
        "take F times longer: GPU workers proving while the GPU itself idles",
    )
    p.add_argument(
        "--cpu-share",
        type=float,
        default=os.environ.get("CUZK_SIM_CPU_SHARE") or None,
        metavar="F",
        help="the daemon gets F (0 < F <= 1) of the reference machine's CPU, where a partition "
        f"synthesizing uses {model.SYNTHESIS_CPU_PER_PARTITION:g} of it: past F / "
        f"{model.SYNTHESIS_CPU_PER_PARTITION:g} partitions at once they share it, and /status "
        "reports the CPU busy share (sim.cpu_busy_share; absent without this flag)",
    )
    p.add_argument(
        "--strict-keepalive",
        action="store_true",
        default=os.environ.get("CUZK_SIM_STRICT_KEEPALIVE", "") not in ("", "0"),
        help="grpc-core's ping policy (5 min, 2 strikes, then GOAWAY too_many_pings) instead of "
        "tonic's (every PING acknowledged)",
    )
    p.add_argument(
        "--keepalive-scale",
        type=float,
        default=_env_default("CUZK_SIM_KEEPALIVE_SCALE", "1"),
        metavar="F",
        help="divide --strict-keepalive's 5 min floor by F (a client's keepalive divided the "
        "same way is checked against it in seconds)",
    )
    chaos.add_arguments(p)  # --chaos-resets --chaos-seed --throttle
    p.add_argument(
        "--timeline",
        type=Path,
        default=os.environ.get("CUZK_SIM_TIMELINE") or None,
        metavar="FILE",
        help="append a JSON line per job entering the pipeline and ending, in simulated time "
        "(sim.daemon.timeline)",
    )
    return p


def fatal(log: logfmt.DaemonLog, message: str, cause: object) -> NoReturn:
    """Die as the Rust daemon does on an error from main: a log line, ``Error:`` on stderr,
    exit code 1 (os._exit: nothing left to tidy, and grpc's shutdown would only delay it)."""
    log.error(TARGET, message, error=str(cause))
    sys.stderr.write(f"Error: {message}\n\nCaused by:\n    {cause}\n")
    sys.stderr.flush()
    os._exit(1)


def io_error(exc: OSError) -> str:
    """Worded as Rust's io::Error prints: "Address already in use (os error 98)"."""
    return f"{os.strerror(exc.errno)} (os error {exc.errno})" if exc.errno else str(exc)


class SimDaemon:
    def __init__(
        self,
        args: argparse.Namespace,
        cfg: SimConfig,
        listen: Address,
        faults: list[FaultSpec],
        log: logfmt.DaemonLog,
    ) -> None:
        self.args = args
        self.cfg = cfg
        self.listen = listen
        self.log = log
        self.gate = HangGate()
        self.rules = CallRules()
        self.proxy: Proxy | None = None
        self.chaos: chaos.ConnectionChaos | None = None
        self._grpc: grpc.aio.Server | None = None  # referenced for the process lifetime
        if args.release == "budget":
            slots = model.budget_partition_slots(cfg.total_budget_bytes, cfg.max_parallel_synthesis)
        else:
            slots = max(1, cfg.partition_workers)
        gpus = args.gpus
        if cfg.devices:
            gpus = len([d for d in cfg.devices if 0 <= d < args.gpus])
        self.memory = Memory(
            args.memory_scale, on_grow=self._on_memory_grow, on_change=self._on_memory_change
        )
        throttle = chaos.Throttle.of(args, self._slow_synthesis, log)
        self.faults = FaultController(
            faults,
            log,
            proofs_completed=lambda: self.engine.completed_total,
            drop=lambda: self.proxy.drop_all() if self.proxy else 0,
            gate=self.gate,
            cgroup_dir=args.cgroup_dir,
            freeze=lambda window_s: self.proxy.freeze_all(window_s) if self.proxy else 0,
            rules=self.rules,
            time_scale=args.time_scale,
            throttle=throttle,
        )
        # The GPUs' condition: the machine's (--gpu-dir), so a GPU lost stays lost.
        self.faults.gpus = GpuState.load(args.gpu_dir, max(1, gpus))
        self.engine = Engine(
            release=args.release,
            slots=slots,
            gpus=max(1, gpus),
            gpu_workers_per_device=max(1, cfg.gpu_workers_per_device),
            param_cache=cfg.param_cache,
            total_budget_bytes=cfg.total_budget_bytes,
            memory=self.memory,
            log=log,
            time_scale=args.time_scale,
            faults=self.faults,
            first_proof_factor=_first_proof_factor(args),
            vram_bytes=SimMachine.from_args(args).vram_bytes,
            timeline=Timeline(args.timeline, log) if args.timeline is not None else None,
            synthesis_factor=args.synthesis_factor,
            gpu_factor=args.gpu_factor,
            cpu_share=args.cpu_share,
            gpu_cpu_factor=args.gpu_cpu_factor,
        )
        self.engine.gpu_steps = GpuSteps(self.faults.gpus, self.faults, log)

    def _slow_synthesis(self, factor: float) -> None:
        self.engine.synthesis_factor *= factor

    def _on_memory_grow(self, key: object, total_gib: float) -> None:
        partition = None
        if isinstance(key, tuple) and key[0] == "partition":
            partition = key[1].index
        self.faults.check("memory", partition=partition, memory_gib=total_gib)

    def _on_memory_change(self, real_bytes: int) -> None:
        if self.args.cgroup_dir is not None:
            chaos.write_memory_current(self.args.cgroup_dir, real_bytes)

    def _on_sigint(self) -> None:
        # The real daemon's ctrl-c handler stops the engine but never the gRPC server, so the
        # process hangs on; a second SIGINT does nothing more.
        if not self.engine.stopped:
            self.engine.stop_workers()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        self.log.info(
            TARGET,
            "cuzk-daemon starting",
            version=VERSION,
            config=str(self.args.config),
            listen=str(self.listen),
        )
        self.log.info(
            "cuzk_sim",
            "simulator settings",
            time_scale=self.args.time_scale,
            memory_scale=self.args.memory_scale,
            release=self.args.release,
            keepalive=(
                f"strict/{self.args.keepalive_scale:g}" if self.args.strict_keepalive else "tonic"
            ),
            faults=";".join(s.text for s in self.faults.specs) or "none",
        )
        self.engine.start()
        grpc_target, upstream_path = private_target("grpc")
        service = ProvingService(self.engine, self.gate, self.rules, self.faults)
        self._grpc = await start_grpc_server(
            service,
            grpc_target,
            strict_keepalive=self.args.strict_keepalive,
            keepalive_scale=self.args.keepalive_scale,
        )
        if self.cfg.status_listen:
            await self._start_status()
        if self.args.release == "workers":
            await self.engine.preload(self.cfg.preload)
        else:
            assert self.engine.clock is not None
            await self.engine.clock.sleep(model.BUDGET_STARTUP_SECONDS)
        self.proxy = Proxy(upstream_path)
        await self._bind()
        self.chaos = chaos.ConnectionChaos.of(self.args, self.proxy.drop_all, self.log)
        self.faults.start_clock()
        self.faults.check("start")
        await loop.create_future()  # serve until killed

    async def _start_status(self) -> None:
        """cuzk-daemon's main.rs: a TCP listener; one that cannot bind (a unix path included)
        is an ERROR line and the daemon runs on without it."""
        listen = self.cfg.status_listen or ""
        try:
            address = parse_address(listen)
            if address.path is not None:
                raise OSError(errno.EINVAL, "invalid socket address")
            await start_status_server(
                address,
                lambda: statusdoc.status_document(
                    self.engine,
                    memory_scale=self.args.memory_scale,
                    gpu_faults=None if self.faults.gpus is None else self.faults.gpus.nvml_errors(),
                ),
                self.gate,
            )
        except (UsageError, OSError) as exc:
            error = io_error(exc) if isinstance(exc, OSError) else str(exc)
            self.log.error(TARGET, "failed to bind status HTTP server", addr=listen, error=error)
            return
        self.log.info(TARGET, "status HTTP server listening", addr=str(address))

    async def _bind(self) -> None:
        assert self.proxy is not None
        fired = {spec.kind for spec in self.faults.check("bind")}
        ready = f"cuzk-daemon ready, serving on {self.listen}"
        if self.listen.path is not None:
            # Unix sockets: a stale file goes at start (never at exit); bound, then "ready".
            remove_stale_socket(str(self.listen.path))
            if "never-ready" in fired:
                self.log.info(TARGET, ready)
                return
            await self._listen_or_die(fired)
            self.log.info(TARGET, ready)
            return
        # TCP: the real daemon logs "ready" and only then binds the port.
        self.log.info(TARGET, ready)
        if "never-ready" in fired:
            return
        delay_ms = float(os.environ.get(BIND_DELAY_ENV) or DEFAULT_BIND_DELAY_MS)
        await asyncio.sleep(delay_ms / 1000)
        await self._listen_or_die(fired)

    async def _listen_or_die(self, fired: set[str]) -> None:
        assert self.proxy is not None
        try:
            if "addr-in-use" in fired:
                raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
            await self.proxy.listen(self.listen)
        except OSError as exc:
            fatal(self.log, "transport error", f"error creating server listener: {io_error(exc)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    machine = SimMachine.from_args(args)
    try:
        cfg = load_config(args.config, mem_total=machine.simulated_mem_total)
    except ConfigError as exc:
        fatal(logfmt.DaemonLog("info"), "failed to load config", exc)
    level = (
        logfmt.level_from_rust_log(os.environ.get("RUST_LOG"))
        or logfmt.normalise_level(args.log_level)
        or logfmt.normalise_level(cfg.log_level)
        or "info"
    )
    log = logfmt.DaemonLog(level)
    try:
        listen = parse_address(args.listen or cfg.listen)
        faults = parse_faults(args.fault, os.environ.get("CUZK_SIM_FAULTS"))
    except (UsageError, FaultSpecError) as exc:
        fatal(log, "invalid arguments", exc)
    problem = (
        machine.problem()
        or machine.folder_problem()
        or ("need time scale > 0" if not args.time_scale > 0 else None)
        or ("need 1 <= keepalive scale <= 1000" if not 1 <= args.keepalive_scale <= 1000 else None)
    )
    if problem is not None:
        fatal(log, "invalid arguments", problem)
    if not 1 <= args.first_proof_factor <= 1000:
        fatal(log, "invalid arguments", "need 1 <= first proof factor <= 1000")
    factors = (args.synthesis_factor, args.gpu_factor, args.gpu_cpu_factor)
    if not all(0.01 <= factor <= 1000 for factor in factors):
        fatal(log, "invalid arguments", "need 0.01 <= synthesis, GPU and GPU CPU factors <= 1000")
    if args.cpu_share is not None and not 0 < args.cpu_share <= 1:
        fatal(log, "invalid arguments", "need 0 < cpu share <= 1")
    if (problem := chaos.problem(args)) is not None:
        fatal(log, "invalid arguments", problem)
    asyncio.run(SimDaemon(args, cfg, listen, faults, log).run())
    return 0
