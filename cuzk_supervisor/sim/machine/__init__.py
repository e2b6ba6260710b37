"""The simulated machine: its GPUs (count, VRAM, hardware condition and faults), its RAM and
memory scale, and the fake NVML that reads them, as the supervisor's probes would see a real
machine's (pynvml, ``/proc``, the cgroup).

Its public face: :class:`SimMachine` and its flags (the shape both the simulated daemon and the
``sim`` command take), and :mod:`.probes`, the machine the ``sim`` command hands to the
composition root. Inside: :mod:`.gpustate` (the GPUs' condition, kept in a folder both sides
read), :mod:`.gpufaults` (what a fault switch does to them), :mod:`.fakenvml`.
"""

from cuzk_supervisor.sim.machine.spec import (
    DEFAULT_VRAM_GIB,
    GIB,
    GPU_NAME,
    MIB,
    SimMachine,
    add_machine_arguments,
    check_daemon_argv,
)

__all__ = [
    "DEFAULT_VRAM_GIB",
    "GIB",
    "GPU_NAME",
    "MIB",
    "SimMachine",
    "add_machine_arguments",
    "check_daemon_argv",
]
