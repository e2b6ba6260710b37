"""The figures a verdict on what bounds the rate rests on, gathered from the daemon's status
samples read as the daemon means them (:mod:`cuzk_supervisor.core.boundsample`):

- **the synthesis stage**: the partition workers come from the config the supervisor rendered
  (the :class:`Shape`), never from ``synthesis.max_concurrent``; the stage is full in a sample
  when the partitions synthesizing (counted from their states: ``active`` leaks) reach the
  workers while partitions wait ``pending`` (:attr:`Evidence.workers_full_share`);
- **the GPU stage**, per GPU: busy when either of its workers is ``proving`` (a ghost's
  partition discounted), with synthesized partitions (``synth_done``) waiting for it; where NVML
  answers, its utilisation says whether the GPU itself or the CPU work around it (preparation,
  finalization) fills that time;
- **the CPU**: its busy share against what the container may use (its quota, the physical
  cores; the caller's meter, ``adapters.machine.cpumeter``);
- leaked ``active`` and ghost pipelines (failed jobs listed forever), counted and left out.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from cuzk_supervisor.core import contention
from cuzk_supervisor.core.boundsample import StatusSample, finished_times


@dataclass(frozen=True, slots=True)
class Shape:
    """What ran: the partition workers of the rendered config, the proofs in flight, the GPUs.
    ``partition_workers`` 0: not known (the most seen synthesizing at once stands in, and the reason
    says so); ``gpu_workers`` 0: as many as the samples show; ``max_workers``: the most partition
    workers the machine's memory allows (the plan's fit; None: not known)."""

    partition_workers: int
    concurrency: int
    gpus: int = 1
    gpu_workers: int = 0
    workers_source: str = "the plan"
    """Where ``partition_workers`` came from, said with the verdict."""
    max_workers: int | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """The figures a verdict rests on (None: not measured). Shares are means over the samples."""

    samples: int
    span_s: float
    gpu_workers: int
    gpus: int
    partition_workers: int
    workers_source: str = "the plan"
    gpu_busy_share: float | None = None
    """Per GPU, the share of the time either of its workers was proving (mean over the GPUs)."""
    gpu_both_share: float | None = None
    """Per GPU, the share of the time all its workers were proving (one waits for the GPU)."""
    synth_done_waiting: float | None = None
    """Synthesized partitions waiting for a GPU worker, mean over the samples."""
    pending_waiting: float | None = None
    """Partitions waiting for a partition worker, mean over the samples."""
    workers_busy_share: float | None = None
    """Mean share of the partition workers synthesizing."""
    workers_full_share: float | None = None
    """Share of the samples with every partition worker synthesizing and partitions pending."""
    synthesis_load: float | None = None
    """The synthesis capacity in use, mean over the samples: the rate of the partitions
    synthesizing at each over the rate of all the workers, both by the table of
    :mod:`~cuzk_supervisor.core.contention` (fewer partitions at once each go faster)."""
    max_concurrent: int = 0
    """``synthesis.max_concurrent`` as the daemon said it (budget / 9 GiB), for the record."""
    leaked_active: int = 0
    """The most ``synthesis.active`` counted beyond the partitions synthesizing."""
    ghost_pipelines: int = 0
    """The most failed jobs listed at once (never completed: discounted)."""
    cpu_busy_share: float | None = None
    synth_s: float | None = None
    """Mean synthesis seconds of one partition (daemon seconds), over finished syntheses."""
    gpu_s: float | None = None
    """Mean GPU-stage seconds of one partition (preparation, wait, CUDA, finalization)."""
    partitions_per_proof: float | None = None
    partitions_timed: int = 0
    gpu_utilisation: float | None = None
    """NVML's utilisation, mean over the samples and GPUs (None without NVML)."""
    sm_clock_ratio: float | None = None
    slowdown_share: float | None = None
    """Share of the samples with NVML figures in which a GPU's clocks were held down."""
    slowdowns: tuple[str, ...] = ()
    """The reasons seen, the most frequent first."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, float):
                value = round(value, 3)
            out[item.name] = list(value) if isinstance(value, tuple) else value
        return out


def in_window(
    samples: Iterable[StatusSample], window: tuple[float, float] | None
) -> list[StatusSample]:
    """The samples taken within ``window`` (inclusive), in time order; all of them without one."""
    chosen = [s for s in samples if window is None or window[0] <= s.at <= window[1]]
    return sorted(chosen, key=lambda s: s.at)


def without_drain(samples: Sequence[StatusSample], concurrency: int) -> list[StatusSample]:
    """The time-ordered samples up to the last one with ``concurrency`` jobs in flight: after it
    the batch drains (nothing more is submitted), which says nothing of the plan."""
    last = max((i for i, s in enumerate(samples) if s.in_flight >= concurrency), default=None)
    return list(samples) if last is None else list(samples[: last + 1])


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return statistics.fmean(items) if items else None


def _gpu_shares(samples: Sequence[StatusSample]) -> tuple[float | None, float | None]:
    """Per GPU and sample: either worker proving, all of them proving; means over both."""
    any_busy: list[float] = []
    all_busy: list[float] = []
    for s in samples:
        per_gpu: dict[int, list[bool]] = {}
        for w in s.gpu_workers:
            per_gpu.setdefault(w.gpu_ordinal, []).append(s.proving(w))
        if per_gpu:
            any_busy.append(statistics.fmean(any(v) for v in per_gpu.values()))
            all_busy.append(statistics.fmean(all(v) for v in per_gpu.values()))
    return _mean(any_busy), _mean(all_busy)


def _gpu_activity(samples: Sequence[StatusSample]) -> dict[str, Any]:
    """NVML's figures over the samples that carry them (:class:`Evidence`'s last four)."""
    with_gpus = [s for s in samples if s.gpus]
    if not with_gpus:
        return {}
    util = [g.utilisation for s in with_gpus for g in s.gpus if g.utilisation is not None]
    clock = [g.sm_clock_ratio for s in with_gpus for g in s.gpus if g.sm_clock_ratio is not None]
    reasons = Counter(r for s in with_gpus for g in s.gpus for r in set(g.slowdowns))
    slowed = sum(1 for s in with_gpus if any(g.slowdowns for g in s.gpus))
    return {
        "gpu_utilisation": _mean(util),
        "sm_clock_ratio": _mean(clock),
        "slowdown_share": slowed / len(with_gpus),
        "slowdowns": tuple(r for r, _ in reasons.most_common()),
    }


def gather(samples: Sequence[StatusSample], shape: Shape) -> Evidence:
    """The figures of :class:`Evidence` from time-ordered samples."""
    seen_workers = max((len(s.gpu_workers) for s in samples), default=0)
    ordinals = {w.gpu_ordinal for s in samples for w in s.gpu_workers}
    gpus = max(len(ordinals), 1) if ordinals else max(shape.gpus, 1)
    workers, source = shape.partition_workers, shape.workers_source
    if workers < 1:
        workers = max((s.synthesizing for s in samples), default=0) or 1
        source = "not told: the most seen synthesizing at once"
    span = samples[-1].at - samples[0].at if samples else 0.0
    base = Evidence(len(samples), span, shape.gpu_workers or seen_workers, gpus, workers, source)
    if not samples:
        return base
    busy, both = _gpu_shares(samples)
    synth, gpu = finished_times(samples)
    totals = [p.total_partitions or len(p.partitions) for s in samples for p in s.pipelines]
    totals = [t for t in totals if t > 0]
    return replace(
        base,
        gpu_busy_share=busy,
        gpu_both_share=both,
        synth_done_waiting=statistics.fmean(s.count("synth_done") for s in samples),
        pending_waiting=statistics.fmean(s.count("pending") for s in samples),
        workers_busy_share=statistics.fmean(min(1.0, s.synthesizing / workers) for s in samples),
        workers_full_share=statistics.fmean(
            s.synthesizing >= workers and s.count("pending") > 0 for s in samples
        ),
        synthesis_load=statistics.fmean(
            contention.proofs_per_hour(min(s.synthesizing, workers)) for s in samples
        )
        / contention.proofs_per_hour(workers),
        max_concurrent=max(s.synth_max for s in samples),
        leaked_active=max(s.leaked_active for s in samples),
        ghost_pipelines=max(len(s.ghosts) for s in samples),
        cpu_busy_share=_mean(s.cpu_busy_share for s in samples if s.cpu_busy_share is not None),
        synth_s=_mean(synth),
        gpu_s=_mean(gpu),
        partitions_per_proof=_mean(totals),
        partitions_timed=min(len(synth), len(gpu)),
        **_gpu_activity(samples),
    )
