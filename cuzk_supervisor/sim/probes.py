"""The supervisor's GPU probe and memory sampler when the daemon is the simulator.

``lifecycle.assemble`` builds them here (for ``run``, ``sim`` and ``doctor``): with the simulated
machine known from the daemon's arguments (``sim.machine``), the GPU probe reports its GPUs idle
before any daemon answers, and the memory sampler reads its RAM (``--host-gib``) as the host's.
Without the simulator, or without those arguments, they are the host's own
(``assemble.host_gpu_probe``, ``assemble.host_memory_sampler``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cuzk_supervisor.adapters.machine.gpu import GpuProbe, SimStatusProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.lifecycle import assemble
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim.machine import SimMachine, sim_daemon_argv


def machine_of(s: Settings, environ: Mapping[str, str] = os.environ) -> SimMachine | None:
    """The machine the configured daemon simulates; None when the daemon is not the simulator.
    UsageError for arguments the simulated daemon would refuse."""
    argv = sim_daemon_argv(s.daemon_binary, s.daemon_args)
    return None if argv is None else SimMachine.from_daemon_argv(argv, environ)


def gpu_probe(s: Settings, machine: SimMachine | None) -> GpuProbe:
    if s.gpu_probe != "sim" or machine is None:
        return assemble.host_gpu_probe(s)
    url = f"http://{s.daemon_status_listen}/status"
    return SimStatusProbe(url, idle_devices=machine.gpu_devices())


def memory_sampler(s: Settings, machine: SimMachine | None) -> MemorySampler:
    base = assemble.host_memory_sampler(s)
    if machine is None or machine.host_gib is None:
        return base
    # The cgroup the ordinary sampler found (or was given) is still read: a real limit is real.
    return MemorySampler(
        proc_root=s.proc_root, cgroup=base.cgroup, discover=False, host=machine.host_memory
    )
