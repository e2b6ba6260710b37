"""The simulated GPUs' faults at work (issue 34): what a fault switch does to the GPUs'
condition (:func:`act`, called by the daemon's fault controller). What that condition does to
the daemon's GPU steps is the engine's (``sim.daemon.engineevents.GpuSteps``).

The switches (``sim.faults``; triggers as for every fault) are ``gpu-lost:GPU``,
``xid:CODE[@GPU]``, ``throttle:RATIO[@GPU]``, ``corrupt:GPU``, ``gpu-crash:GPU`` and ``stuck``;
what each does: docs/simulator.md, "The GPUs' faults and the run phase's demand". A GPU lost
stays lost for the daemon's life and the next ones (the condition is the machine's,
``--gpu-dir``); ``throttle`` leaves the proofs' times as they were (NVML's clocks show it).
"""

from __future__ import annotations

from cuzk_supervisor.sim.daemon import logfmt
from cuzk_supervisor.sim.faults import FaultSpec
from cuzk_supervisor.sim.machine.gpustate import GpuState, gpu_and_number

TARGET = "cuzk_sim::gpu"
GPU_FAULTS = frozenset({"gpu-lost", "xid", "throttle", "corrupt", "gpu-crash"})
"""The switches that change the GPUs' condition (``stuck`` acts on one step: the engine's)."""


def act(state: GpuState, spec: FaultSpec, log: logfmt.DaemonLog) -> None:
    """Carry out one of :data:`GPU_FAULTS` on the GPUs' condition (kept in ``--gpu-dir``)."""
    number, gpu = gpu_and_number(spec.arg or "0")
    if spec.kind == "gpu-lost":
        gpu = int(number)
        state.lose(gpu)
        log.error(TARGET, "GPU has fallen off the bus", gpu=gpu, xid=79)
    elif spec.kind == "xid":
        state.xid(gpu, int(number))
        log.error(TARGET, "NVRM: Xid", gpu=gpu, xid=int(number))
    elif spec.kind == "throttle":
        state.throttle(gpu, number)
        log.warn(TARGET, "GPU clocks held down", gpu=gpu, ratio=number)
    elif spec.kind == "corrupt":
        state.corrupt(int(number))
        log.warn(TARGET, "GPU computes wrong results", gpu=int(number))
    elif spec.kind == "gpu-crash":
        state.crash(int(number))
        log.warn(TARGET, "GPU crashes the daemon at its next step", gpu=int(number))
