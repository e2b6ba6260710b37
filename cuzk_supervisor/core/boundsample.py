"""One answer of the daemon's ``GET /status`` (``[daemon] status_listen``), parsed and read as the
daemon means it (``cuzk-core/src/status.rs``; ``docs/daemon.md``, "Optional HTTP status listener").

What each field holds, from the daemon's code:

- ``synthesis.max_concurrent`` is the memory budget's total over 9 GiB, an upper bound over
  proof kinds, **not** the partition limiter: kept only to be shown. The partition workers come
  from the config the supervisor rendered (the caller's :class:`~.boundevidence.Shape`).
- ``synthesis.active`` is +1 at a synthesis start and -1 at its end; a failed synthesis never
  takes its +1 back. The partitions synthesizing now are counted from the partitions' states
  (:attr:`StatusSample.synthesizing`); what ``active`` says beyond them is a leak
  (:attr:`StatusSample.leaked_active`).
- A job whose synthesis failed is never completed and stays listed for the daemon's life, its
  waiting partitions ``pending`` forever: a **ghost** (:attr:`StatusSample.ghosts`). Its
  partitions waiting are not work waiting, and a GPU worker shown ``proving`` one of its
  partitions has in fact left it (engine.rs skips a failed job's partition at once, without
  clearing the worker's state until its next pickup).
- ``synth_ms``/``gpu_ms`` are live while a step runs; only a finished step's figure is a
  duration (:func:`finished_times`). ``gpu_ms`` is the GPU stage: CPU preparation, the wait for
  the GPU (the workers of one GPU take turns), the CUDA work and the finalization.
- A worker is ``proving`` from its pickup until the finalizer clears it or it picks up the next
  partition; ``busy_secs`` is the time since the current pickup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PARTITION_STATES = frozenset({"pending", "synthesizing", "synth_done", "gpu", "done", "failed"})
PAST_SYNTHESIS = frozenset({"synth_done", "gpu", "done"})


@dataclass(frozen=True, slots=True)
class PartitionSample:
    index: int
    state: str
    """pending, synthesizing, synth_done, gpu, done or failed (anything else is ignored)."""
    synth_ms: float | None = None
    gpu_ms: float | None = None


@dataclass(frozen=True, slots=True)
class PipelineSample:
    """One job the daemon lists."""

    job_id: str
    partitions: tuple[PartitionSample, ...] = ()
    total_partitions: int = 0

    @property
    def ghost(self) -> bool:
        """Its synthesis failed: the daemon will never complete it (module docstring)."""
        return any(p.state == "failed" for p in self.partitions)

    @property
    def done(self) -> int:
        return sum(1 for p in self.partitions if p.state == "done")


@dataclass(frozen=True, slots=True)
class GpuWorkerSample:
    worker_id: int
    gpu_ordinal: int
    proving: bool
    current_job: str | None = None
    busy_secs: float | None = None


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """One GPU as NVML saw it at a sample (None: not reported by this GPU or driver)."""

    index: int
    utilisation: float | None = None
    """Share of the last sample period a kernel ran (0 to 1)."""
    sm_clock_ratio: float | None = None
    """The SM clock over its maximum."""
    slowdowns: tuple[str, ...] = ()
    """Active reasons that hold the clocks below what the load asks for: ``power-cap``,
    ``thermal``, ``hw-slowdown``, ``hw-thermal``, ``power-brake``."""


@dataclass(frozen=True, slots=True)
class StatusSample:
    """One ``GET /status`` answer, at ``at`` seconds on the caller's clock."""

    at: float
    synth_max: int
    """``synthesis.max_concurrent``: budget / 9 GiB (shown, never used as the limiter)."""
    synth_active: int
    """``synthesis.active``, leaks included."""
    pipelines: tuple[PipelineSample, ...] = ()
    gpu_workers: tuple[GpuWorkerSample, ...] = ()
    cpu_busy_share: float | None = None
    """The machine's CPU busy share at that moment, where known."""
    gpus: tuple[GpuActivity, ...] = ()
    """NVML's view of each GPU at that moment (none without NVML)."""

    @property
    def ghosts(self) -> frozenset[str]:
        return frozenset(p.job_id for p in self.pipelines if p.ghost)

    def count(self, state: str, *, ghosts: bool = False) -> int:
        """Partitions in ``state``; a ghost's only with ``ghosts``."""
        pipelines = [p for p in self.pipelines if ghosts or not p.ghost]
        return sum(1 for p in pipelines for part in p.partitions if part.state == state)

    @property
    def synthesizing(self) -> int:
        """Partitions synthesizing now: a ghost's too (they run to their end)."""
        return self.count("synthesizing", ghosts=True)

    @property
    def leaked_active(self) -> int:
        """What ``synthesis.active`` counts beyond the partitions synthesizing."""
        return max(0, self.synth_active - self.synthesizing)

    def proving(self, worker: GpuWorkerSample) -> bool:
        """``proving``, unless on a ghost's partition (the worker left it at its pickup)."""
        return worker.proving and worker.current_job not in self.ghosts

    def gpu_load(self) -> dict[int, int]:
        """GPU ordinal -> its workers proving (ghosts discounted)."""
        load: dict[int, int] = {}
        for worker in self.gpu_workers:
            load[worker.gpu_ordinal] = load.get(worker.gpu_ordinal, 0) + self.proving(worker)
        return load

    @property
    def in_flight(self) -> int:
        """Jobs the daemon lists with partitions still to prove (ghosts left out)."""
        return sum(
            1
            for p in self.pipelines
            if not p.ghost and p.done < (p.total_partitions or len(p.partitions))
        )

    def partitions_by_job(self) -> dict[str, tuple[int, int]]:
        """job id -> (partitions done, partitions), for a person's live line."""
        return {
            p.job_id: (p.done, len(p.partitions))
            for p in self.pipelines
            if p.job_id and p.partitions
        }


def finished_times(samples: Iterable[StatusSample]) -> tuple[list[float], list[float]]:
    """Distinct partitions' synthesis and GPU-stage seconds, each from a step that had ended
    (the live figure of a running step is not a duration); ghosts left out."""
    synth: dict[tuple[str, int], float] = {}
    gpu: dict[tuple[str, int], float] = {}
    for sample in samples:
        for pipeline in sample.pipelines:
            if pipeline.ghost:
                continue
            for part in pipeline.partitions:
                key = (pipeline.job_id, part.index)
                if part.state in PAST_SYNTHESIS and part.synth_ms:
                    synth[key] = part.synth_ms / 1000
                if part.state == "done" and part.gpu_ms:
                    gpu[key] = part.gpu_ms / 1000
    return list(synth.values()), list(gpu.values())


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _share(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value)))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pipeline(item: Mapping[str, Any]) -> PipelineSample:
    parts = tuple(
        PartitionSample(_int(p.get("index")), str(p.get("state", "")), _number(p.get("synth_ms")),
                        _number(p.get("gpu_ms")))
        for p in item.get("partitions") or ()
        if isinstance(p, dict)
    )  # fmt: skip
    return PipelineSample(str(item.get("job_id", "")), parts, _int(item.get("total_partitions")))


def sim_gpus(sim: Mapping[str, Any]) -> tuple[GpuActivity, ...]:
    """The simulator's stand-in for NVML (``sim.gpus[].utilisation``)."""
    found = []
    for item in sim.get("gpus") or ():
        if isinstance(item, dict) and _share(item.get("utilisation")) is not None:
            found.append(GpuActivity(_int(item.get("index")), _share(item.get("utilisation"))))
    return tuple(found)


def parse_status(
    document: object,
    at: float,
    cpu_busy_share: float | None = None,
    gpus: tuple[GpuActivity, ...] = (),
) -> StatusSample | None:
    """A sample from one ``/status`` document; None when it has no ``synthesis`` object. Items
    that are not what the daemon writes are left out, never fatal. The simulator's ``sim``
    object, where there is one, gives its machine's CPU and GPUs (ours are not the daemon's)."""
    if not isinstance(document, dict):
        return None
    synthesis = document.get("synthesis")
    if not isinstance(synthesis, dict):
        return None
    pipelines = tuple(_pipeline(p) for p in document.get("pipelines") or () if isinstance(p, dict))
    workers = tuple(
        GpuWorkerSample(
            _int(w.get("worker_id"), i), _int(w.get("gpu_ordinal")), w.get("state") == "proving",
            _text(w.get("current_job")), _number(w.get("busy_secs")),
        )
        for i, w in enumerate(document.get("gpu_workers") or ())
        if isinstance(w, dict)
    )  # fmt: skip
    sim = document.get("sim")
    if isinstance(sim, dict):
        cpu_busy_share = _share(sim.get("cpu_busy_share"))
        gpus = gpus or sim_gpus(sim)
    synth_max = max(0, _int(synthesis.get("max_concurrent")))
    active = max(0, _int(synthesis.get("active")))
    return StatusSample(at, synth_max, active, pipelines, workers, cpu_busy_share, gpus)
