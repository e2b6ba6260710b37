"""The simulated GPUs' faults at work (issue 34): what a fault switch does to the GPUs'
condition (:func:`act`, called by the fault controller), and what that condition does to the
daemon's GPU steps (:class:`GpuSteps`, called by the engine as a partition reaches a GPU worker
and as a proof is about to be returned).

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

import os
import signal
from typing import TYPE_CHECKING

from cuzk_supervisor.sim.daemon import logfmt
from cuzk_supervisor.sim.faults import FaultSpec
from cuzk_supervisor.sim.machine.gpustate import GpuState, gpu_and_number

if TYPE_CHECKING:
    from cuzk_supervisor.sim.daemon.chaos import FaultController
    from cuzk_supervisor.sim.daemon.engineevents import PipelineEvents
    from cuzk_supervisor.sim.daemon.job import Job
    from cuzk_supervisor.sim.daemon.pipeline import GpuStarted

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


class GpuSteps:
    """What the GPUs' condition does to the engine's GPU steps."""

    def __init__(
        self, state: GpuState, faults: FaultController | None, log: logfmt.DaemonLog
    ) -> None:
        self.state = state
        self._faults = faults
        self._log = log
        self._wrong: dict[int, int] = {}  # job seq -> the GPU that computed a wrong partition

    def started(self, engine: PipelineEvents, job: Job, event: GpuStarted) -> None:
        """A partition reached a GPU worker: the GPU's trouble, if any, happens now."""
        gpu = event.worker // max(1, engine.gpu_workers_per_device)
        condition = self.state.condition(gpu)
        index = event.part.index
        if condition.crash:
            self._log.error(TARGET, "CUDA error: an illegal memory access was encountered",
                            gpu=gpu, job_id=job.job_id, partition=index)  # fmt: skip
            os.kill(os.getpid(), signal.SIGSEGV)
        if condition.lost:
            error = (f"partition {index} GPU prove failed: CUDA error 999: unspecified launch "
                     f"failure (simulated: GPU {gpu} {condition.lost})")  # fmt: skip
            self._log.error("cuzk_core::engine", "partition GPU proving failed",
                            job_id=job.job_id, partition=index, error=error)  # fmt: skip
            engine.fail_job(job, error, event.at, worker=event.worker)
            return
        if condition.corrupt:
            self._wrong[job.seq] = gpu
        if self._faults is not None:
            fired = self._faults.check("gpu", partition=index)
            if any(spec.kind == "stuck" for spec in fired):
                engine.pipeline.stick(event.worker)

    def self_check(self, job: Job) -> str | None:
        """The error of a proof whose partition a corrupt GPU proved (None: it verifies)."""
        gpu = self._wrong.pop(job.seq, None)
        if gpu is None:
            return None
        self._log.error("cuzk_core::engine", "PoRep proof self-check FAILED — proof will NOT be "
                        "returned to caller", job_id=job.job_id)  # fmt: skip
        return (f"PoRep proof self-check failed: assembled proof did not verify (simulated: GPU "
                f"{gpu} computes wrong results)")  # fmt: skip
