"""What bounds the bench's rate, and what would lift it (issue 25, items 2 and 3).

The daemon's HTTP status (``reference/cuzk.md``, "Optional HTTP status listener"), sampled while a
bench stretch runs, says where the pipeline's partitions wait: for a synthesis slot (the limiter,
``synthesis{max_concurrent, active}``), or synthesized for a GPU worker (``synth_done``), and
whether the GPU workers are ``proving`` or ``idle``. :func:`judge` turns those samples and the
bench's shape into a :class:`Verdict`:

- **gpu-bound**: the GPU workers prove nearly all the time (:data:`BUSY`) and synthesized
  partitions wait for them (or the limiter is not full): more partition workers (more RAM) would
  not raise the rate; another GPU would.
- **synthesis-bound**: the limiter is full nearly all the time and the GPU workers idle a
  measurable share; the limit is the partition workers the plan allowed or, when the CPU's busy
  share is known and high, the CPU itself.
- **feed-bound**: neither is saturated: the bench's concurrency did not keep the pipeline full.
- **mixed**: both saturated at once (a balanced pipeline).
- **unknown**: too few samples (:data:`MIN_SAMPLES`) or no GPU worker seen, said plainly.

Where NVML answers, each sample also carries each GPU's utilisation, SM clock against its
maximum and the reasons its clocks are held down (:class:`GpuActivity`): the evidence gives their
means, and a GPU-bound or mixed reason says when the clocks were held down in
:data:`SLOWED` of the samples or more (a hot or power-capped GPU, not the plan).

Projections (:func:`project`) come from the measured per-partition ``synth_ms`` and ``gpu_ms``
with a small model of the pipeline, stated with its assumptions (:data:`ASSUMPTIONS`): ``C``
proofs in flight (the next submitted as one completes), each of ``P`` partitions synthesized FIFO
``W`` at a time in ``s`` seconds (as measured, whatever the number synthesizing at once), then
proved FIFO on the first free of ``G`` GPU workers in ``g`` seconds; its steady rate is read off
the completions of a run of :data:`MODEL_PROOFS` (:func:`closed_loop_completions`). Rates are
proofs per hour of the caller's clock (the daemon's seconds divided by
``daemon_seconds_per_second``).

Pure: the samples carry their own times (any one clock the caller chooses); nothing here reads a
clock or does I/O. The JSON is parsed into these dataclasses by the adapter
(:mod:`cuzk_supervisor.adapters.proving.statussampler`).
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

HOUR_S = 3600.0
MIN_SAMPLES = 8
"""Fewer samples than this in the stretch: the verdict is ``unknown``."""
BUSY = 0.9
"""GPU workers busy at least this share of the time: the GPU is saturated."""
FULL = 0.9
"""The limiter's slots in use at least this share on average: synthesis is saturated."""
WAITING = 0.5
"""Synthesized partitions waiting for a GPU worker, on average, that show a GPU queue."""
CPU_FULL = 0.9
"""A CPU busy at least this share while synthesis-bound: the CPU is the limit."""
SLOWED = 0.2
"""A GPU's clocks held down (power cap, heat) in at least this share of the samples: said in the
reason, since then the GPU's cooling or power limit, not the plan, holds a GPU-bound rate."""

PARTITION_STATES = frozenset({"pending", "synthesizing", "synth_done", "gpu", "done", "failed"})


class Bound(StrEnum):
    GPU = "gpu-bound"
    SYNTHESIS = "synthesis-bound"
    FEED = "feed-bound"
    MIXED = "mixed"
    UNKNOWN = "unknown"


# --- the samples ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionSample:
    index: int
    state: str
    """pending, synthesizing, synth_done, gpu, done or failed (anything else is ignored)."""
    synth_ms: float | None = None
    gpu_ms: float | None = None


@dataclass(frozen=True, slots=True)
class PipelineSample:
    """One job in flight."""

    job_id: str
    partitions: tuple[PartitionSample, ...] = ()
    total_partitions: int = 0


@dataclass(frozen=True, slots=True)
class GpuWorkerSample:
    worker_id: int
    gpu_ordinal: int
    proving: bool


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
    synth_active: int
    pipelines: tuple[PipelineSample, ...] = ()
    gpu_workers: tuple[GpuWorkerSample, ...] = ()
    cpu_busy_share: float | None = None
    """The machine's CPU busy share at that moment, where known."""
    gpus: tuple[GpuActivity, ...] = ()
    """NVML's view of each GPU at that moment (none without NVML)."""

    def count(self, state: str) -> int:
        return sum(1 for p in self.pipelines for part in p.partitions if part.state == state)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the bench ran: the plan's partition workers and GPUs, the bench's concurrency.
    ``gpu_workers`` 0: as many as the samples show."""

    partition_workers: int
    concurrency: int
    gpus: int = 1
    gpu_workers: int = 0


# --- the verdict ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evidence:
    """The figures a verdict rests on (None: not measured)."""

    samples: int
    span_s: float
    gpu_workers: int
    gpus: int
    synth_slots: int
    gpu_busy_share: float | None = None
    synth_done_waiting: float | None = None
    """Synthesized partitions waiting for a GPU worker, mean over the samples."""
    pending_waiting: float | None = None
    """Partitions waiting for a synthesis slot, mean over the samples."""
    limiter_use: float | None = None
    """Mean ``active / max_concurrent``."""
    cpu_busy_share: float | None = None
    synth_s: float | None = None
    """Mean synthesis seconds of one partition (daemon seconds), over distinct partitions."""
    gpu_s: float | None = None
    partitions_per_proof: float | None = None
    partitions_timed: int = 0
    gpu_utilisation: float | None = None
    """NVML's utilisation, mean over the samples and GPUs (None without NVML)."""
    sm_clock_ratio: float | None = None
    """The SM clock over its maximum, mean over the samples and GPUs."""
    slowdown_share: float | None = None
    """Share of the samples with NVML figures in which a GPU's clocks were held down."""
    slowdowns: tuple[str, ...] = ()
    """The reasons seen, the most frequent first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "span_s": round(self.span_s, 3),
            "gpu_workers": self.gpu_workers,
            "gpus": self.gpus,
            "synth_slots": self.synth_slots,
            "gpu_busy_share": _round(self.gpu_busy_share),
            "synth_done_waiting": _round(self.synth_done_waiting, 2),
            "pending_waiting": _round(self.pending_waiting, 2),
            "limiter_use": _round(self.limiter_use),
            "cpu_busy_share": _round(self.cpu_busy_share),
            "synth_s": _round(self.synth_s),
            "gpu_s": _round(self.gpu_s),
            "partitions_per_proof": _round(self.partitions_per_proof, 2),
            "partitions_timed": self.partitions_timed,
            "gpu_utilisation": _round(self.gpu_utilisation),
            "sm_clock_ratio": _round(self.sm_clock_ratio),
            "slowdown_share": _round(self.slowdown_share),
            "slowdowns": list(self.slowdowns),
        }


@dataclass(frozen=True, slots=True)
class Projection:
    """The modelled rate of one configuration (module docstring): a figure, not a promise."""

    name: str
    """``as-run``, ``more-workers``, ``one-more-in-flight`` or ``one-more-gpu``."""
    change: str
    workers: int
    concurrency: int
    gpu_workers: int
    rate_per_hour: float
    limit: str
    """Which term of the model binds: ``synthesis``, ``gpu`` or ``feed``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "change": self.change,
            "workers": self.workers,
            "concurrency": self.concurrency,
            "gpu_workers": self.gpu_workers,
            "rate": round(self.rate_per_hour, 3),
            "limit": self.limit,
        }


ASSUMPTIONS = (
    "per-partition synthesis and GPU times stay as measured (more partitions at once may slow "
    "each one); partitions synthesized FIFO W at a time, then proved FIFO on G GPU workers, with "
    "C proofs in flight; memory, CPU and PCIe not modelled"
)


@dataclass(frozen=True, slots=True)
class Verdict:
    bound: Bound
    reason: str
    """In words, with the figures."""
    evidence: Evidence
    limit: str | None = None
    """Synthesis-bound only: ``partition-workers`` or ``cpu`` (None: the CPU was not known)."""
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
            "assumptions": ASSUMPTIONS if self.projections else "",
        }

    def line(self) -> str:
        """One line in words for a person (the manager's benchout tab): the verdict, then the
        changes the model says would raise the rate (more workers left out while the CPU is
        the limit: the model does not know the CPU)."""
        text = f"{self.bound}: {self.reason}"
        as_run = self.projection("as-run")
        if as_run is None:
            return text
        lifts = [
            p
            for p in self.projections
            if p.name != "as-run"
            and p.rate_per_hour > 1.01 * as_run.rate_per_hour
            and not (p.name == "more-workers" and self.limit == "cpu")
        ]
        if lifts:
            words = ", ".join(f"{p.change} ~{p.rate_per_hour:.1f}" for p in lifts)
            text += f"; model, proofs/hour (as run {as_run.rate_per_hour:.1f}): {words}"
        return text


# --- the arithmetic ---------------------------------------------------------------------------


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def in_window(
    samples: Iterable[StatusSample], window: tuple[float, float] | None
) -> list[StatusSample]:
    """The samples taken within ``window`` (inclusive), in time order; all of them without one."""
    chosen = [s for s in samples if window is None or window[0] <= s.at <= window[1]]
    return sorted(chosen, key=lambda s: s.at)


def partition_times(samples: Iterable[StatusSample]) -> tuple[list[float], list[float]]:
    """Distinct partitions' synthesis and GPU seconds (the latest figure of each job/index)."""
    synth: dict[tuple[str, int], float] = {}
    gpu: dict[tuple[str, int], float] = {}
    for sample in samples:
        for pipeline in sample.pipelines:
            for part in pipeline.partitions:
                key = (pipeline.job_id, part.index)
                if part.synth_ms is not None and part.synth_ms > 0:
                    synth[key] = part.synth_ms / 1000
                if part.gpu_ms is not None and part.gpu_ms > 0:
                    gpu[key] = part.gpu_ms / 1000
    return list(synth.values()), list(gpu.values())


def gather(samples: Sequence[StatusSample], shape: Shape) -> Evidence:
    """The figures of :class:`Evidence` from time-ordered samples."""
    seen_workers = max((len(s.gpu_workers) for s in samples), default=0)
    gpu_workers = shape.gpu_workers or seen_workers
    ordinals = {w.gpu_ordinal for s in samples for w in s.gpu_workers}
    gpus = max(shape.gpus, len(ordinals), 1)
    slots = max((s.synth_max for s in samples), default=0) or shape.partition_workers
    n = len(samples)
    span = samples[-1].at - samples[0].at if n else 0.0
    if n == 0:
        return Evidence(0, 0.0, gpu_workers, gpus, slots)
    with_workers = [s for s in samples if s.gpu_workers]
    busy = None
    if with_workers:
        busy = statistics.fmean(
            sum(w.proving for w in s.gpu_workers) / len(s.gpu_workers) for s in with_workers
        )
    use = statistics.fmean(
        min(1.0, s.synth_active / s.synth_max) if s.synth_max > 0 else 0.0 for s in samples
    )
    cpus = [s.cpu_busy_share for s in samples if s.cpu_busy_share is not None]
    synth, gpu = partition_times(samples)
    totals = [p.total_partitions or len(p.partitions) for s in samples for p in s.pipelines]
    totals = [t for t in totals if t > 0]
    return Evidence(
        samples=n,
        span_s=span,
        gpu_workers=gpu_workers,
        gpus=gpus,
        synth_slots=slots,
        gpu_busy_share=busy,
        synth_done_waiting=statistics.fmean(s.count("synth_done") for s in samples),
        pending_waiting=statistics.fmean(s.count("pending") for s in samples),
        limiter_use=use,
        cpu_busy_share=statistics.fmean(cpus) if cpus else None,
        synth_s=statistics.fmean(synth) if synth else None,
        gpu_s=statistics.fmean(gpu) if gpu else None,
        partitions_per_proof=statistics.fmean(totals) if totals else None,
        partitions_timed=min(len(synth), len(gpu)),
        **_gpu_activity(samples),
    )


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
        "gpu_utilisation": statistics.fmean(util) if util else None,
        "sm_clock_ratio": statistics.fmean(clock) if clock else None,
        "slowdown_share": slowed / len(with_gpus),
        "slowdowns": tuple(r for r, _ in reasons.most_common()),
    }


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


def closed_loop_completions(
    partitions: int,
    workers: int,
    gpu_workers: int,
    concurrency: int,
    synth_s: float,
    gpu_s: float,
    proofs: int,
) -> list[float]:
    """When each of ``proofs`` proofs completes in the module's pipeline model: ``concurrency``
    in flight (the next submitted as one completes), partitions synthesized FIFO ``workers`` at a
    time in ``synth_s`` each, then proved FIFO on the first free of ``gpu_workers`` in ``gpu_s``."""
    pending: deque[int] = deque()
    synthesizing: list[tuple[float, int, int]] = []  # (end, order, job)
    gpu_queue: deque[int] = deque()
    proving: list[tuple[float, int, int]] = []
    left: dict[int, int] = {}
    done: list[float] = []
    order = itertools.count()
    jobs = itertools.count()

    def submit() -> None:
        job = next(jobs)
        left[job] = partitions
        pending.extend([job] * partitions)

    for _ in range(concurrency):
        submit()
    now = 0.0
    while len(done) < proofs:
        while pending and len(synthesizing) < workers:
            heapq.heappush(synthesizing, (now + synth_s, next(order), pending.popleft()))
        while gpu_queue and len(proving) < gpu_workers:
            heapq.heappush(proving, (now + gpu_s, next(order), gpu_queue.popleft()))
        now = min(h[0][0] for h in (synthesizing, proving) if h)
        while synthesizing and synthesizing[0][0] == now:
            gpu_queue.append(heapq.heappop(synthesizing)[2])
        while proving and proving[0][0] == now:
            job = heapq.heappop(proving)[2]
            left[job] -= 1
            if left[job] == 0:
                done.append(now)
                submit()
    return done


MODEL_PROOFS = 60
MODEL_SKIP = 20
"""The model's steady rate: the slope over completions MODEL_SKIP..MODEL_PROOFS (the fill left
out, as the bench leaves it out)."""


def modelled_rate(
    *,
    synth_s: float,
    gpu_s: float,
    partitions: float,
    workers: int,
    gpu_workers: int,
    concurrency: int,
    daemon_seconds_per_second: float = 1.0,
) -> tuple[float, str]:
    """Proofs per hour (caller's clock) of the module's model, and what binds it: ``gpu`` or
    ``synthesis`` when the rate is within 3 % of that step's capacity, else ``feed``."""
    count = round(partitions)
    if min(synth_s, gpu_s) <= 0 or count < 1 or min(workers, gpu_workers, concurrency) < 1:
        return 0.0, "none"
    done = closed_loop_completions(
        count, workers, gpu_workers, concurrency, synth_s, gpu_s, MODEL_PROOFS
    )
    span = done[-1] - done[MODEL_SKIP - 1]
    per_s = (MODEL_PROOFS - MODEL_SKIP) / span  # proofs per daemon second
    capacity = {"gpu": gpu_workers / gpu_s / count, "synthesis": workers / synth_s / count}
    limit = next((name for name, cap in capacity.items() if per_s >= 0.97 * cap), "feed")
    return per_s * HOUR_S / daemon_seconds_per_second, limit


def project(
    evidence: Evidence, shape: Shape, daemon_seconds_per_second: float = 1.0
) -> tuple[Projection, ...]:
    """The model's rate as run, with twice the partition workers, one more proof in flight and
    one more GPU; none without measured partition times."""
    if evidence.synth_s is None or evidence.gpu_s is None or not evidence.partitions_per_proof:
        return ()
    workers = max(1, evidence.synth_slots or shape.partition_workers)
    gpu_workers = max(1, evidence.gpu_workers)
    per_gpu = max(1, gpu_workers // max(1, evidence.gpus))
    concurrency = max(1, shape.concurrency)
    cases = (
        ("as-run", "as run", workers, concurrency, gpu_workers),
        ("more-workers", f"{2 * workers} partition workers", 2 * workers, concurrency,
         gpu_workers),
        ("one-more-in-flight", f"{concurrency + 1} in flight", workers, concurrency + 1,
         gpu_workers),
        ("one-more-gpu", f"one more GPU ({gpu_workers + per_gpu} GPU workers)", workers,
         concurrency, gpu_workers + per_gpu),
    )  # fmt: skip
    projections: list[Projection] = []
    for name, change, w, c, g in cases:
        rate, limit = modelled_rate(
            synth_s=evidence.synth_s, gpu_s=evidence.gpu_s,
            partitions=evidence.partitions_per_proof, workers=w, gpu_workers=g, concurrency=c,
            daemon_seconds_per_second=daemon_seconds_per_second,
        )  # fmt: skip
        if projections:
            # Each case only adds a resource, which never slows a FIFO pipeline: a figure below
            # as-run is the model's finite window (seen at -1.0 % with 7.6 partitions a proof).
            rate = max(rate, projections[0].rate_per_hour)
        projections.append(Projection(name, change, w, c, g, rate, limit))
    return tuple(projections)


def judge(
    samples: Iterable[StatusSample],
    shape: Shape,
    *,
    window: tuple[float, float] | None = None,
    daemon_seconds_per_second: float = 1.0,
) -> Verdict:
    """What bounded the rate over ``window`` (the module docstring's rules), with the figures."""
    chosen = in_window(samples, window)
    evidence = gather(chosen, shape)
    projections = project(evidence, shape, daemon_seconds_per_second)
    if evidence.samples < MIN_SAMPLES:
        why = (
            "no status samples (the daemon's status_listen did not answer, or sampling is off)"
            if evidence.samples == 0
            else f"only {evidence.samples} status samples (need {MIN_SAMPLES})"
        )
        return Verdict(Bound.UNKNOWN, why, evidence, projections=projections)
    busy, use = evidence.gpu_busy_share, evidence.limiter_use
    if busy is None or use is None:
        return Verdict(Bound.UNKNOWN, "no GPU worker in the status", evidence,
                       projections=projections)  # fmt: skip
    waiting = evidence.synth_done_waiting or 0.0
    gpus = f"{evidence.gpu_workers} GPU worker{'s' if evidence.gpu_workers != 1 else ''}"
    limiter = f"the limiter's {evidence.synth_slots} slots {_pct(use)} in use"
    if busy >= BUSY and (waiting >= WAITING or use < FULL):
        reason = (
            f"{gpus} busy {_pct(busy)} of the time; {waiting:.1f} synthesized partitions "
            f"waiting on average; more RAM would not raise the rate{_nvml_note(evidence)}"
        )
        return Verdict(Bound.GPU, reason, evidence, projections=projections)
    if busy >= BUSY:
        reason = (
            f"{gpus} busy {_pct(busy)} of the time and {limiter}: both near their limit"
            f"{_nvml_note(evidence)}"
        )
        return Verdict(Bound.MIXED, reason, evidence, projections=projections)
    if use >= FULL:
        cpu = evidence.cpu_busy_share
        if cpu is None:
            limit, which = None, "CPU busy share not known"
        elif cpu >= CPU_FULL:
            limit, which = "cpu", f"the CPU is the limit (busy {_pct(cpu)})"
        else:
            limit, which = (
                "partition-workers",
                f"the partition workers the plan allowed are the limit (CPU busy {_pct(cpu)})",
            )
        reason = f"{limiter}, {gpus} idle {_pct(1 - busy)} of the time; {which}"
        return Verdict(Bound.SYNTHESIS, reason, evidence, limit, projections)
    reason = (
        f"neither saturated ({limiter}, {gpus} busy {_pct(busy)}): the bench's concurrency "
        f"{shape.concurrency} did not keep the pipeline full"
    )
    return Verdict(Bound.FEED, reason, evidence, projections=projections)
