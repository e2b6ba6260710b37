"""The machine the simulator hands in to the composition root (``cuzk_supervisor.compose``).

``machine(environ)`` is a ``compose.Machine``: the ``sim`` command hands it to the lifecycle,
and ``cli.simhandoff`` to ``run``, ``doctor``, ``plan`` and ``daemon`` when their daemon is the
simulated one. Its machine is known from the daemon's arguments (``sim.machine``), so the GPU
probe reports its GPUs idle before any daemon answers, the memory sampler reads its RAM
(``--host-gib``) as the host's, and what the simulated daemon would refuse at its start is
refused before anything starts. Without those arguments (``--host-gib``, ``gpu_probe`` sim)
they are the host's own (``compose.host_gpu_probe``, ``compose.host_memory_sampler``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cuzk_supervisor import compose
from cuzk_supervisor.adapters.machine.gpu import GpuProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.daemon.simulated import sim_daemon_argv
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim.machine import SimMachine, check_daemon_argv

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth


def machine(environ: Mapping[str, str] = os.environ) -> compose.Machine:
    """The probes of the machine the configured daemon simulates (the host's when it is not
    the simulator); ``environ`` gives the simulated daemon's ``CUZK_SIM_*`` defaults."""
    return compose.Machine(
        gpu_probe=lambda s: gpu_probe(s, machine_of(s, environ)),
        memory_sampler=lambda s: memory_sampler(s, machine_of(s, environ)),
        check=lambda s: check(s, environ),
        gpu_health=lambda s: gpu_health(s, machine_of(s, environ)),
    )


def machine_of(s: Settings, environ: Mapping[str, str] = os.environ) -> SimMachine | None:
    """The machine the configured daemon simulates; None when the daemon is not the simulator.
    UsageError for arguments the simulated daemon would refuse."""
    argv = sim_daemon_argv(s.daemon_binary, s.daemon_args)
    return None if argv is None else SimMachine.from_daemon_argv(argv, environ)


def gpu_probe(s: Settings, machine: SimMachine | None) -> GpuProbe:
    if s.gpu_probe != "sim" or machine is None:
        return compose.host_gpu_probe(s)
    # Here: a run against the simulator with another GPU probe (the benches') loads neither
    # this probe nor urllib.request, as a real run does not.
    from cuzk_supervisor.adapters.machine.gpusimstatus import SimStatusProbe

    url = f"http://{s.daemon_status_listen}/status"
    return SimStatusProbe(url, idle_devices=machine.gpu_devices())


def gpu_health(s: Settings, machine: SimMachine | None) -> NvmlHealth | None:
    """The run phase's NVML reads of the simulated GPUs: the fake NVML (``sim.machine.fakenvml``)
    over
    the condition the daemon keeps in ``--gpu-dir``, and whether each GPU works now from the
    daemon's status; the host's NVML when the daemon is not the simulator or keeps none."""
    if s.gpu_probe != "sim" or machine is None or machine.gpu_dir is None:
        return compose.host_gpu_health(s)
    if s.health_interval_s <= 0:
        return None
    from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth
    from cuzk_supervisor.sim.machine.fakenvml import FakeNvml, GpuStateFile

    url = f"http://{s.daemon_status_listen}/status"
    fake = FakeNvml(
        machine.gpus, GpuStateFile(machine.gpu_dir, machine.gpus),
        busy=lambda: busy_gpus(url), vram_bytes=machine.vram_bytes,
    )  # fmt: skip
    return NvmlHealth(fake)


def busy_gpus(url: str, timeout_s: float = 1.0) -> frozenset[int] | None:
    """The GPUs a worker of which the daemon's status shows proving (None: no answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            document = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    workers = document.get("gpu_workers") if isinstance(document, dict) else None
    return frozenset(
        int(w.get("gpu_ordinal", 0))
        for w in workers or ()
        if isinstance(w, dict) and w.get("state") == "proving"
    )


def memory_sampler(s: Settings, machine: SimMachine | None) -> MemorySampler:
    base = compose.host_memory_sampler(s)
    if machine is None or machine.host_gib is None:
        return base
    # The cgroup the ordinary sampler found (or was given) is still read: a real limit is real.
    return MemorySampler(
        proc_root=s.proc_root, cgroup=base.cgroup, discover=False, host=machine.host_memory
    )


def check(s: Settings, environ: Mapping[str, str]) -> None:
    """When the daemon is the simulator: what it would refuse at its start, refused now (its
    machine's values, every fault switch, a ``--cgroup-dir`` that is not a folder)."""
    argv = sim_daemon_argv(s.daemon_binary, s.daemon_args)
    if argv is None:
        return
    problem = check_daemon_argv(argv, environ).folder_problem()
    if problem is not None:  # it would exit at every start: a crash loop, not a run
        raise UsageError(f"simulated daemon: {problem}")
