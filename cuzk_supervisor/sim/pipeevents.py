"""What the partition pipeline (``sim.pipeline``) says happened, each at its simulated time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Part:
    """Partition ``index`` of the job with submission sequence number ``seq``."""

    seq: int
    index: int


@dataclass(frozen=True, slots=True)
class Started:
    """A partition started synthesizing with ``active`` synthesizing (itself included);
    ``seconds``: what it would take if that many synthesized throughout."""

    at: float
    part: Part
    active: int
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class SynthesisFailed:
    """A partition's synthesis failed (as it started): its job is failed from now on."""

    at: float
    part: Part

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class Synthesized:
    at: float
    part: Part
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class GpuStarted:
    """A GPU worker picked the partition up (status.rs: partition_gpu_start)."""

    at: float
    part: Part
    worker: int

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class GpuSkipped:
    """The worker that picked it up found its job failed and left it (free again at once)."""

    at: float
    part: Part
    worker: int

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class CudaStarted:
    """The worker got its GPU and the CUDA work started."""

    at: float
    part: Part
    worker: int

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class CudaFinished:
    """The CUDA work ended: the GPU is free, the worker too; the finalization goes on."""

    at: float
    part: Part
    worker: int

    @property
    def seq(self) -> int:
        return self.part.seq


@dataclass(frozen=True, slots=True)
class GpuFinished:
    """The finalization ended (status.rs: partition_gpu_end); ``seconds`` since the pickup."""

    at: float
    part: Part
    worker: int
    seconds: float

    @property
    def seq(self) -> int:
        return self.part.seq


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
