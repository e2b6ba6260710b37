"""What bounds the bench's rate, and what would lift it (issues 25 and 33): the rules.

The daemon's HTTP status, sampled while a bench stretch runs and read as the daemon means it
(:mod:`~cuzk_supervisor.core.boundsample`, :mod:`~cuzk_supervisor.core.boundevidence`), says
where the pipeline's partitions wait. :func:`judge` turns the samples, the bench's shape and its
measured rate into a :class:`Verdict`:

- **gpu-bound**: each GPU's stage busy (either of its workers ``proving``) nearly all the time
  (:data:`BUSY`) with synthesized partitions waiting for it (or synthesis not full), and, where
  NVML answers, the GPUs used (:data:`GPU_USED`): more partition workers (more RAM) would not
  raise the rate; another or a faster GPU would.
- **gpu-stage-bound**: the same, but NVML says the GPUs themselves are used less than
  :data:`GPU_USED`: the CPU work around the GPU (preparation, the finalization) holds the stage;
  a faster GPU would not help, more CPU for it would.
- **synthesis-bound**: the partition workers' capacity in use nearly all the time (:data:`FULL`,
  by the measured contention); the limit is the CPU (busy :data:`CPU_FULL` or more), the memory
  bandwidth (the table shows no gain from more workers), or the partition workers the plan
  allowed.
- **feed-bound**: neither stage full: the proofs in flight did not keep the pipeline full.
- **mixed**: both full at once, nothing waiting for the GPU (a balanced pipeline).
- **unknown**: too few samples (:data:`MIN_SAMPLES`) or no GPU worker seen, said plainly.

NVML's clocks: a gpu-bound or mixed reason says when they were held down in :data:`SLOWED` of
the samples or more (a hot or power-capped GPU, not the plan). The projections
(:mod:`~cuzk_supervisor.core.boundproject`) scale the measured rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cuzk_supervisor.core import contention
from cuzk_supervisor.core.boundevidence import Evidence, Shape, gather, in_window, without_drain
from cuzk_supervisor.core.boundproject import COMMON, Projection, project
from cuzk_supervisor.core.boundsample import (
    PARTITION_STATES,
    GpuActivity,
    GpuWorkerSample,
    PartitionSample,
    PipelineSample,
    StatusSample,
    parse_status,
)

__all__ = [
    "PARTITION_STATES",
    "Bound",
    "Evidence",
    "GpuActivity",
    "GpuWorkerSample",
    "PartitionSample",
    "PipelineSample",
    "Projection",
    "Shape",
    "StatusSample",
    "Verdict",
    "judge",
    "parse_status",
]

MIN_SAMPLES = 8
"""Fewer samples than this in the stretch: the verdict is ``unknown``."""
BUSY = 0.9
"""A GPU's stage busy at least this share of the time: the GPU stage is saturated."""
GPU_USED = 0.7
"""NVML utilisation under this while the stage is saturated: the CPU around the GPU holds it."""
FULL = 0.9
"""The partition workers' capacity in use at least this share: synthesis is saturated."""
WAITING = 0.5
"""Synthesized partitions waiting for a GPU worker, on average, that show a GPU queue."""
CPU_FULL = 0.9
"""A CPU busy at least this share while synthesis-bound: the CPU is the limit."""
SLOWED = 0.2
"""A GPU's clocks held down (power cap, heat) in at least this share of the samples."""


class Bound(StrEnum):
    GPU = "gpu-bound"
    GPU_STAGE = "gpu-stage-bound"
    SYNTHESIS = "synthesis-bound"
    FEED = "feed-bound"
    MIXED = "mixed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Verdict:
    bound: Bound
    reason: str
    """In words, with the figures."""
    evidence: Evidence
    limit: str | None = None
    """Synthesis-bound: ``cpu``, ``memory-bandwidth``, ``partition-workers`` or None (the CPU
    not known); gpu-stage-bound: ``cpu``."""
    projections: tuple[Projection, ...] = field(default=())

    def projection(self, name: str) -> Projection | None:
        return next((p for p in self.projections if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": str(self.bound),
            "limit": self.limit,
            "reason": self.reason,
            "evidence": self.evidence.to_dict(),
            "projections": [p.to_dict() for p in self.projections],
            "assumptions": COMMON if self.projections else "",
        }

    def line(self) -> str:
        """One line in words for a person (the manager's benchout tab): the verdict, the
        partition workers it was read against, then the changes that would raise the rate."""
        e = self.evidence
        text = f"{self.bound}: {self.reason} [partition workers {e.partition_workers}: "
        text += f"{e.workers_source}]"
        as_run = self.projection("as-run")
        if as_run is None:
            return text
        floor = 1.01 * as_run.rate_per_hour
        lifts = [p for p in self.projections if p.name != "as-run" and p.rate_per_hour > floor]
        if lifts:
            words = ", ".join(f"{p.change} ~{p.rate_per_hour:.1f}" for p in lifts)
            text += f"; model, proofs/hour (as run {as_run.rate_per_hour:.1f}): {words}"
        return text


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def _nvml_note(evidence: Evidence) -> str:
    """What NVML adds to a reason about the GPUs ('' without NVML figures)."""
    parts = []
    if evidence.gpu_utilisation is not None:
        parts.append(f"NVML utilisation {_pct(evidence.gpu_utilisation)}")
    share = evidence.slowdown_share
    if share is not None and share >= SLOWED:
        clock = evidence.sm_clock_ratio
        at = f", SM clock at {_pct(clock)} of its maximum" if clock is not None else ""
        parts.append(
            f"clocks held down ({', '.join(evidence.slowdowns)}) in {_pct(share)} of the "
            f"samples{at}: cooling or the power limit holds the rate, not the plan"
        )
    return "; " + "; ".join(parts) if parts else ""


def _discounted(evidence: Evidence) -> str:
    """The daemon's leftovers the figures left out ('' when there were none)."""
    parts = []
    if evidence.leaked_active:
        parts.append(f"{evidence.leaked_active} on synthesis.active leaked by failed syntheses")
    if evidence.ghost_pipelines:
        n = evidence.ghost_pipelines
        parts.append(f"{n} failed job{'s' if n != 1 else ''} the daemon still lists")
    return f" (left out: {'; '.join(parts)})" if parts else ""


def judge(
    samples: Iterable[StatusSample],
    shape: Shape,
    *,
    window: tuple[float, float] | None = None,
    rate_per_hour: float | None = None,
) -> Verdict:
    """What bounded the rate over ``window`` (the module docstring's rules), with the figures
    and, given the rate measured there (proofs per daemon hour), the projections."""
    evidence = gather(without_drain(in_window(samples, window), shape.concurrency), shape)
    projections = project(evidence, shape, rate_per_hour) if evidence.samples else ()
    if evidence.samples < MIN_SAMPLES:
        why = (
            "no status samples (the daemon's status_listen did not answer, or sampling is off)"
            if evidence.samples == 0
            else f"only {evidence.samples} status samples (need {MIN_SAMPLES})"
        )
        return Verdict(Bound.UNKNOWN, why, evidence, projections=projections)
    busy, load = evidence.gpu_busy_share, evidence.synthesis_load
    if busy is None or load is None:
        return Verdict(Bound.UNKNOWN, "no GPU worker in the status", evidence,
                       projections=projections)  # fmt: skip
    return _rules(evidence, shape, busy, load, projections)


def _rules(
    e: Evidence, shape: Shape, busy: float, load: float, projections: tuple[Projection, ...]
) -> Verdict:
    waiting = e.synth_done_waiting or 0.0
    gpus = f"{e.gpus} GPU{'s' if e.gpus != 1 else ''}"
    workers = (
        f"the {e.partition_workers} partition workers' capacity {_pct(load)} in use "
        f"({_pct(e.workers_busy_share or 0.0)} of them synthesizing)"
    )
    left_out = _discounted(e)
    synthesis_full = load >= FULL
    if busy >= BUSY and (waiting >= WAITING or not synthesis_full):
        stage = (
            f"{gpus} busy {_pct(busy)} of the time (a worker proving); {waiting:.1f} "
            f"synthesized partitions waiting on average"
        )
        if e.gpu_utilisation is not None and e.gpu_utilisation < GPU_USED:
            reason = (
                f"{stage}, but NVML says the GPUs are used {_pct(e.gpu_utilisation)}: the CPU "
                f"work around the GPU (preparation, finalization) holds the stage; a faster GPU "
                f"would not raise the rate{left_out}"
            )
            return Verdict(Bound.GPU_STAGE, reason, e, "cpu", projections)
        reason = f"{stage}; more RAM would not raise the rate{_nvml_note(e)}{left_out}"
        return Verdict(Bound.GPU, reason, e, projections=projections)
    if busy >= BUSY:
        reason = f"{gpus} busy {_pct(busy)} of the time and {workers}: both near their limit"
        return Verdict(Bound.MIXED, reason, e, projections=projections)
    if synthesis_full:
        limit, which = _synthesis_limit(e)
        reason = f"{workers}, {gpus} idle {_pct(1 - busy)} of the time; {which}{left_out}"
        return Verdict(Bound.SYNTHESIS, reason, e, limit, projections)
    reason = (
        f"neither stage full ({workers}, {gpus} busy {_pct(busy)}): the {shape.concurrency} "
        f"proofs in flight did not keep the pipeline full{left_out}"
    )
    return Verdict(Bound.FEED, reason, e, projections=projections)


def _synthesis_limit(e: Evidence) -> tuple[str | None, str]:
    cpu = e.cpu_busy_share
    if cpu is not None and cpu >= CPU_FULL:
        return "cpu", f"the CPU is the limit (busy {_pct(cpu)})"
    if contention.plateau(e.partition_workers):
        return "memory-bandwidth", (
            "the memory bandwidth is the limit: upstream's measured table "
            '(docs/daemon.md, "Measured figures") shows no gain from more workers past 10'
        )
    if cpu is None:
        return None, "the partition workers or the CPU (its busy share not known)"
    return (
        "partition-workers",
        f"the partition workers the plan allowed are the limit (CPU busy {_pct(cpu)})",
    )
