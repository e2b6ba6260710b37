"""What the partition pipeline (``sim.daemon.pipeline``) says happened, each at its simulated
time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Part:
    """Partition ``index`` of the job with submission sequence number ``seq``."""

    seq: int
    index: int


@dataclass(frozen=True, slots=True)
class _OfPart:
    """Something that happened to one partition."""

    at: float
    part: Part

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class Started(_OfPart):
    """It started synthesizing with ``active`` synthesizing (itself included); ``seconds``:
    what it would take if that many synthesized throughout."""

    active: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SynthesisFailed(_OfPart):
    """Its synthesis failed (as it started): its job is failed from now on."""


@dataclass(frozen=True, slots=True)
class Synthesized(_OfPart):
    seconds: float


@dataclass(frozen=True, slots=True)
class _OnWorker(_OfPart):
    worker: int


@dataclass(frozen=True, slots=True)
class GpuStarted(_OnWorker):
    """A GPU worker picked it up (status.rs: partition_gpu_start)."""


@dataclass(frozen=True, slots=True)
class GpuSkipped(_OnWorker):
    """The worker that picked it up found its job failed and left it (free again at once)."""


@dataclass(frozen=True, slots=True)
class CudaStarted(_OnWorker):
    """The worker got its GPU and the CUDA work started."""


@dataclass(frozen=True, slots=True)
class CudaFinished(_OnWorker):
    """The CUDA work ended: the GPU is free, the worker too; the finalization goes on."""


@dataclass(frozen=True, slots=True)
class GpuFinished(_OnWorker):
    """The finalization ended (status.rs: partition_gpu_end); ``seconds`` since the pickup."""

    seconds: float


@dataclass(frozen=True, slots=True)
class JobSynthesized:
    at: float
    seq: int


@dataclass(frozen=True, slots=True)
class JobProved:
    at: float
    seq: int


Event = (
    Started
    | SynthesisFailed
    | Synthesized
    | GpuStarted
    | GpuSkipped
    | CudaStarted
    | CudaFinished
    | GpuFinished
    | JobSynthesized
    | JobProved
)
