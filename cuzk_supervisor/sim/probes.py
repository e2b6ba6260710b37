"""The machine the simulator hands in to the composition root (``cuzk_supervisor.compose``).

``machine(environ)`` is a ``compose.Machine`` for ``run``, ``sim``, ``doctor``, ``plan`` and
``daemon`` (the ``sim`` command hands it to each): when the configured daemon is the simulated
one, its machine is known from the daemon's arguments (``sim.machine``), so the GPU probe reports
its GPUs idle before any daemon answers, the memory sampler reads its RAM (``--host-gib``) as the
host's, and what the simulated daemon would refuse at its start is refused before anything
starts. With any other daemon, or without those arguments, they are the host's own
(``compose.host_gpu_probe``, ``compose.host_memory_sampler``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cuzk_supervisor import compose
from cuzk_supervisor.adapters.machine.gpu import GpuProbe, SimStatusProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.sim.machine import SimMachine, check_daemon_argv, sim_daemon_argv


def machine(environ: Mapping[str, str] = os.environ) -> compose.Machine:
    """The probes of the machine the configured daemon simulates (the host's when it is not
    the simulator); ``environ`` gives the simulated daemon's ``CUZK_SIM_*`` defaults."""
    return compose.Machine(
        gpu_probe=lambda s: gpu_probe(s, machine_of(s, environ)),
        memory_sampler=lambda s: memory_sampler(s, machine_of(s, environ)),
        check=lambda s: check(s, environ),
    )


def machine_of(s: Settings, environ: Mapping[str, str] = os.environ) -> SimMachine | None:
    """The machine the configured daemon simulates; None when the daemon is not the simulator.
    UsageError for arguments the simulated daemon would refuse."""
    argv = sim_daemon_argv(s.daemon_binary, s.daemon_args)
    return None if argv is None else SimMachine.from_daemon_argv(argv, environ)


def gpu_probe(s: Settings, machine: SimMachine | None) -> GpuProbe:
    if s.gpu_probe != "sim" or machine is None:
        return compose.host_gpu_probe(s)
    url = f"http://{s.daemon_status_listen}/status"
    return SimStatusProbe(url, idle_devices=machine.gpu_devices())


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
