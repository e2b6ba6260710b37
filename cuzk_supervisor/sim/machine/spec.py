"""The simulated machine: how many GPUs, how much VRAM each, how much RAM, at what memory scale.

One description, read by both sides. The simulated daemon takes it as arguments (``--gpus``,
``--vram-gib``, ``--host-gib``, ``--memory-scale``, ``--cgroup-dir``, each with a ``CUZK_SIM_*``
variable); the supervisor reads the same arguments out of ``daemon_args``
(``daemon.simulated.sim_daemon_argv``) so that its probes know the machine before any daemon
runs: the plan sees the GPUs and applies its VRAM rule, and the memory it plans from is the
simulated RAM, not the laptop's RAM times the memory scale.

Sizes are simulated GiB. Memory is really allocated at ``memory_scale`` real MiB per simulated
GiB, so the supervisor measures real bytes and plans with ``plan_memory_scale`` = 1024 /
``memory_scale``; the simulated RAM is presented to it at that scale too (``host_memory``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.faults import FaultSpecError, parse_faults

if TYPE_CHECKING:
    # Imported where used: only the supervisor's sim probes read them, and the simulated daemon
    # (which imports this module) would load structlog, psutil and urllib for nothing.
    from cuzk_supervisor.adapters.machine.gpu import GpuDevice
    from cuzk_supervisor.adapters.machine.resources import HostMemory

GPU_NAME = "NVIDIA GeForce RTX 3090 (cuzk-sim)"
DEFAULT_VRAM_GIB = 24.0
"""An RTX 3090's; a proof holds 12 GiB of it (``model.GPU_VRAM_PROVING_GIB``)."""
GIB = 1 << 30
MIB = 1 << 20
FAULTS_ENV = "CUZK_SIM_FAULTS"


def _env(environ: Mapping[str, str], name: str, default: str) -> str:
    return environ.get(name) or default


def add_machine_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ
) -> None:
    """The machine's arguments of the simulated daemon (defaults from ``CUZK_SIM_*``)."""
    parser.add_argument(
        "--memory-scale",
        type=float,
        default=_env(environ, "CUZK_SIM_MEMORY_SCALE", "1"),
        help="real MiB allocated per simulated GiB",
    )
    parser.add_argument("--gpus", type=int, default=_env(environ, "CUZK_SIM_GPUS", "1"))
    parser.add_argument(
        "--vram-gib",
        type=float,
        default=_env(environ, "CUZK_SIM_VRAM_GIB", f"{DEFAULT_VRAM_GIB:g}"),
        help="VRAM of each simulated GPU, in GiB",
    )
    parser.add_argument(
        "--host-gib",
        type=float,
        default=_env(environ, "CUZK_SIM_HOST_GIB", "") or None,
        help="simulated RAM in GiB: the daemon's MemTotal, and the supervisor's host memory "
        "(default: the real MemTotal, unscaled, as before)",
    )
    parser.add_argument(
        "--cgroup-dir", type=Path, default=environ.get("CUZK_SIM_CGROUP_DIR") or None
    )
    parser.add_argument(
        "--gpu-dir",
        type=Path,
        default=environ.get("CUZK_SIM_GPU_DIR") or None,
        help="where the GPUs' condition is kept (sim.machine.gpustate: lost, ECC, XIDs, clocks), "
        "so that it outlives the daemon; the supervisor's fake NVML reads it (gpu_probe sim)",
    )


@dataclass(frozen=True, slots=True)
class SimMachine:
    gpus: int = 1
    vram_gib: float = DEFAULT_VRAM_GIB
    host_gib: float | None = None
    memory_scale: float = 1.0
    """Real MiB allocated per simulated GiB."""
    cgroup_dir: Path | None = None
    """Where the daemon keeps ``memory.current`` (the real bytes of its simulated allocations)."""
    gpu_dir: Path | None = None
    """Where the GPUs' condition is kept (``sim.machine.gpustate``)."""

    def problem(self) -> str | None:
        """Why the simulated daemon would refuse this machine (None: it would not)."""
        if self.gpus < 1:
            return f"--gpus must be >= 1, got {self.gpus}"
        if not 0 < self.vram_gib <= 1024:
            return f"--vram-gib must be in (0, 1024], got {self.vram_gib:g}"
        if not 0 <= self.memory_scale < float("inf"):
            return f"--memory-scale must be >= 0, got {self.memory_scale:g}"
        if self.host_gib is not None:
            if not 1 <= self.host_gib <= 1 << 20:
                return f"--host-gib must be in [1, 1048576], got {self.host_gib:g}"
            if self.memory_scale == 0:
                return "--host-gib needs a --memory-scale above 0"
        return None

    def folder_problem(self) -> str | None:
        """Why the daemon could not keep its ``memory.current`` (None: it can). Checked when the
        daemon starts, not with the arguments: ``sim`` makes the folder after checking them."""
        if self.cgroup_dir is not None and not self.cgroup_dir.is_dir():
            return (
                f"--cgroup-dir {self.cgroup_dir}: no such directory (the simulated daemon "
                "keeps its memory.current there)"
            )
        if self.gpu_dir is not None and not self.gpu_dir.is_dir():
            return f"--gpu-dir {self.gpu_dir}: no such directory (the GPUs' condition lives there)"
        return None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimMachine:
        return cls(
            gpus=args.gpus,
            vram_gib=args.vram_gib,
            host_gib=args.host_gib,
            memory_scale=args.memory_scale,
            cgroup_dir=args.cgroup_dir,
            gpu_dir=args.gpu_dir,
        )

    @classmethod
    def from_daemon_argv(
        cls, argv: Sequence[str], environ: Mapping[str, str] = os.environ
    ) -> SimMachine:
        """The machine the simulated daemon would simulate with these arguments (UsageError
        for a value it would refuse)."""
        parser = _Parser(add_help=False)
        add_machine_arguments(parser, environ)
        args, _ = parser.parse_known_args(list(argv))
        machine = cls.from_args(args)
        problem = machine.problem()
        if problem is not None:
            raise UsageError(f"simulated daemon: {problem}")
        return machine

    @property
    def vram_bytes(self) -> int:
        return math.ceil(self.vram_gib * GIB)

    def gpu_devices(self) -> tuple[GpuDevice, ...]:
        """The GPUs as NVML would list them with nothing running on them."""
        from cuzk_supervisor.adapters.machine.gpu import GpuDevice

        total = self.vram_bytes
        return tuple(GpuDevice(i, GPU_NAME, None, total, 0, total) for i in range(self.gpus))

    @property
    def simulated_mem_total(self) -> int | None:
        """The daemon's MemTotal in simulated bytes (None: it reads the real one)."""
        return None if self.host_gib is None else math.ceil(self.host_gib * GIB)

    @property
    def host_total_bytes(self) -> int | None:
        """The simulated RAM in real bytes (what is allocated for it), None when not set."""
        if self.host_gib is None:
            return None
        return int(self.host_gib * self.memory_scale * MIB)

    def used_bytes(self) -> int:
        """Real bytes of the daemon's simulated allocations (0 when none is known)."""
        if self.cgroup_dir is None:
            return 0
        try:
            return max(0, int((self.cgroup_dir / "memory.current").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            return 0

    def host_memory(self) -> HostMemory:
        """The simulated RAM as the supervisor's memory sampler reads a host (real bytes)."""
        from cuzk_supervisor.adapters.machine.resources import HostMemory

        total = self.host_total_bytes
        if total is None:
            raise ValueError("no simulated RAM (--host-gib) on this machine")
        used = min(self.used_bytes(), total)
        return HostMemory(total=total, available=total - used, used=used)

    def describe(self) -> str:
        """One line for a person: the machine, and the scale named once."""
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} of {self.vram_gib:g} GiB VRAM"
        ram = f", {self.host_gib:g} GiB RAM" if self.host_gib is not None else ""
        return f"{gpus}{ram} (simulated GiB: {self.memory_scale:g} real MiB each)"


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting: the supervisor reads the arguments."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"simulated daemon arguments: {message}")


def check_daemon_argv(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> SimMachine:
    """What the simulated daemon would refuse at its start, refused now (UsageError): the
    machine's values and every fault switch (``--fault`` and ``CUZK_SIM_FAULTS``). Returns the
    machine it would simulate."""
    machine = SimMachine.from_daemon_argv(argv, environ)
    parser = _Parser(add_help=False)
    parser.add_argument("--fault", action="append", default=[])
    args, _ = parser.parse_known_args(list(argv))
    try:
        parse_faults(args.fault, environ.get(FAULTS_ENV))
    except FaultSpecError as exc:
        raise UsageError(f"simulated daemon fault: {exc}") from None
    return machine
