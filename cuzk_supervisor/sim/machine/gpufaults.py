"""The simulated GPUs' faults at work (issue 34): what a fault switch does to the GPUs'
condition (:func:`act`, called by the daemon's fault controller). What that condition does to
the daemon's GPU steps is the engine's (``sim.daemon.engineevents.GpuSteps``).

The switches (``sim.faults``; triggers as for every fault):

- ``gpu-lost:GPU``: the GPU falls off the bus (XID 79): NVML no longer reads it and every GPU
  step on it fails, "partition N GPU prove failed: ..." as the engine words it; for the daemon's
  life and the next ones (the condition is the machine's, ``--gpu-dir``);
- ``xid:CODE[@GPU]``: an XID event (48, 94 and 95 also count an uncorrected ECC error, 48, 63
  and 64 retire a page; 79 loses the GPU);
- ``throttle:RATIO[@GPU]``: the GPU's clocks held at RATIO of their maximum under load
  (hardware slowdown), as NVML reports them (the proofs' times are left as they were);
- ``corrupt:GPU``: the GPU computes wrong results: every proof with a partition proved on it
  fails its self-check ("PoRep proof self-check failed ..."), from then on;
- ``gpu-crash:GPU``: the daemon dies (SIGSEGV) at every GPU step on it: a crash loop on a bad
  card;
- ``stuck``: the GPU step of the partition it fires at never ends (``at_partition=K``); the
  worker stays busy with it.
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
