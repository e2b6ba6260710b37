"""What one change would do to the measured rate (issue 33, item 4): a small model of three
capacities, anchored on the rate measured as run, each stated with its assumptions.

- **Synthesis**: its capacity is the measured rate over its measured load (the utilisation law;
  the load weighs each sample's partitions synthesizing by the rate the table of
  :mod:`~cuzk_supervisor.core.contention` gives them). More workers scale it by that table's
  gain (measured contention: cores, then memory bandwidth), and only as far as the proofs in
  flight hold partitions (``10 x C``), the memory allows (the plan's fit) and the CPU has room
  (busy 90 % or more: no gain).
- **GPU stage**: its capacity is the measured rate over the GPUs' load: NVML's utilisation where
  it answers (or the share of the time all of a GPU's workers were proving, if higher: the CPU
  work around the GPU can fill it too), else the share of the time either worker was proving (a
  floor: the workers of a GPU overlap their CPU work with the other's CUDA work). One more GPU
  scales it by (G + 1) / G.
- **Feed**: ``C`` proofs in flight, each taking its rounds of synthesis (``ceil(P / W)`` at the
  measured partition time scaled by the table) and the GPU time of its last round (the GPU's
  service time per partition, measured load over throughput), when nothing waits. The rate is
  at most ``C / latency``; this term is scaled to the measured rate where the feed is what binds.

A projection is the measured rate times the smallest capacity after the change over the
smallest as run, so ``as-run`` is the measured rate and a change that does not touch the
binding term changes nothing. Rates are proofs per hour of the daemon's clock, as the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.core import contention
from cuzk_supervisor.core.boundevidence import Evidence, Shape

CPU_FULL = 0.9
"""A CPU busy at least this share: more partition workers share the same cores."""
FEED_SHARE = 0.9
"""Both stages loaded under this share: the feed binds as run."""
MIN_LOAD = 0.02
"""A stage loaded under this share gives no capacity figure (too little to scale)."""

COMMON = (
    "capacities from the measured rate over each stage's measured load (the utilisation law); "
    "queueing, PCIe and memory beyond the plan not modelled"
)


@dataclass(frozen=True, slots=True)
class Projection:
    """The modelled rate of one configuration: a figure, not a promise."""

    name: str
    """``as-run``, ``more-workers``, ``one-more-in-flight`` or ``one-more-gpu``."""
    change: str
    workers: int
    concurrency: int
    gpus: int
    gpu_workers: int
    rate_per_hour: float
    limit: str
    """Which capacity binds after the change: ``synthesis``, ``gpu`` or ``feed``."""
    assumptions: tuple[str, ...] = ()
    """What the figure rests on beyond the common ones, and the limits it met."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "change": self.change,
            "workers": self.workers,
            "concurrency": self.concurrency,
            "gpus": self.gpus,
            "gpu_workers": self.gpu_workers,
            "rate": round(self.rate_per_hour, 3),
            "limit": self.limit,
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True, slots=True)
class _Base:
    rate: float
    workers: int
    concurrency: int
    gpus: int
    per_gpu: int
    partitions: int
    synth_load: float | None
    gpu_load: float | None
    gpu_from: str
    synth_s: float | None
    cpu: float | None


def _base(evidence: Evidence, shape: Shape, rate: float) -> _Base:
    gpus = max(1, evidence.gpus)
    per_gpu = max(1, evidence.gpu_workers // gpus) if evidence.gpu_workers else 2
    if evidence.gpu_utilisation is not None:
        both = evidence.gpu_both_share or 0.0
        load: float | None = max(evidence.gpu_utilisation, both)
        source = (
            "GPU capacity from NVML's utilisation"
            if evidence.gpu_utilisation >= both
            else "GPU stage capacity from the time all its workers were proving (NVML says the "
            "GPU itself idles part of it: the CPU work around it fills the stage)"
        )
    else:
        load = evidence.gpu_busy_share
        source = (
            "GPU capacity from the time a worker was proving (a floor: without NVML the CUDA "
            "share of it is not known)"
        )
    return _Base(
        rate=rate,
        workers=evidence.partition_workers,
        concurrency=max(1, shape.concurrency),
        gpus=gpus,
        per_gpu=per_gpu,
        partitions=round(evidence.partitions_per_proof or contention.PARTITIONS),
        synth_load=evidence.synthesis_load,
        gpu_load=load,
        gpu_from=source,
        synth_s=evidence.synth_s,
        cpu=evidence.cpu_busy_share,
    )


def _capacities(b: _Base, workers: int, concurrency: int, gpus: int) -> dict[str, float]:
    """Each capacity (proofs per hour) with that plan; a stage too idle to scale is left out."""
    caps: dict[str, float] = {}
    held = min(workers, b.partitions * concurrency)
    if b.synth_load is not None and b.synth_load >= MIN_LOAD:
        caps["synthesis"] = b.rate / b.synth_load * contention.gain(b.workers, held)
    if b.gpu_load is not None and b.gpu_load >= MIN_LOAD:
        caps["gpu"] = b.rate / b.gpu_load * gpus / b.gpus
    feed = _feed(b, workers, concurrency, gpus)
    if feed is not None:
        caps["feed"] = feed
    return caps


def _feed(b: _Base, workers: int, concurrency: int, gpus: int) -> float | None:
    """``C`` proofs in flight over one proof's latency when nothing waits (module docstring)."""
    if b.synth_s is None or b.gpu_load is None or b.rate <= 0:
        return None
    at_once = min(workers, b.partitions)
    rounds = math.ceil(b.partitions / at_once)
    as_run_at_once = min(b.workers, b.partitions)
    scale = contention.partition_seconds(at_once) / contention.partition_seconds(as_run_at_once)
    last = b.partitions - (rounds - 1) * at_once
    # The GPU's service time per partition: its load over its throughput (utilisation law).
    service = b.gpu_load * b.gpus * 3600.0 / (b.rate * b.partitions)
    latency = rounds * b.synth_s * scale + math.ceil(last / gpus) * service
    return concurrency * 3600.0 / latency


def _binding(caps: dict[str, float]) -> tuple[str, float]:
    name = min(caps, key=lambda k: caps[k])
    return name, caps[name]


def project(
    evidence: Evidence, shape: Shape, rate_per_hour: float | None
) -> tuple[Projection, ...]:
    """The measured rate as run, then with more partition workers, one more proof in flight
    and one more GPU; none without a measured rate and a loaded stage."""
    if not rate_per_hour or rate_per_hour <= 0:
        return ()
    b = _base(evidence, shape, rate_per_hour)
    caps = _capacities(b, b.workers, b.concurrency, b.gpus)
    if not caps:
        return ()
    feed_bound = max(b.synth_load or 0.0, b.gpu_load or 0.0) < FEED_SHARE
    feed_factor = 1.0
    if "feed" in caps:
        # The feed model anchored on the measurement: to the rate where the feed binds as run,
        # never below the rate elsewhere (it was not what held it).
        ratio = b.rate / caps["feed"]
        feed_factor = ratio if feed_bound else max(1.0, ratio)
        caps["feed"] *= feed_factor
    base_limit, base_cap = _binding(caps)

    def case(name: str, change: str, w: int, c: int, g: int, notes: list[str]) -> Projection:
        after = _capacities(b, w, c, g)
        if "feed" in after:
            after["feed"] *= feed_factor
        if w != b.workers and b.cpu is not None and b.cpu >= CPU_FULL and "synthesis" in after:
            after["synthesis"] = caps.get("synthesis", after["synthesis"])
        limit, cap = _binding(after)
        # Each change only adds a resource, which never slows a pipeline: a figure below the
        # measured rate is the feed term's crude latency (no queueing within a proof).
        rate = b.rate * max(1.0, cap / base_cap)
        fed = (
            f"{c} proofs in flight keep the changed plan fed (the next one submitted as one "
            "completes; a loop this small can leave a stage idle while another works: then less)"
        )
        return Projection(name, change, w, c, g, g * b.per_gpu, rate, limit,
                          (b.gpu_from, *notes, fed))  # fmt: skip

    as_run = Projection("as-run", "as run", b.workers, b.concurrency, b.gpus,
                        b.gpus * b.per_gpu, b.rate, base_limit, (b.gpu_from,))  # fmt: skip
    more, notes = _more_workers(b, shape)
    return (
        as_run,
        case("more-workers", f"{more} partition workers", more, b.concurrency, b.gpus, notes),
        case("one-more-in-flight", f"{b.concurrency + 1} in flight", b.workers,
             b.concurrency + 1, b.gpus, ["a proof's latency as without queueing"]),
        case("one-more-gpu", f"one more GPU ({b.gpus + 1} GPUs)", b.workers, b.concurrency,
             b.gpus + 1, ["another GPU like these, with its own workers"]),
    )  # fmt: skip


def _more_workers(b: _Base, shape: Shape) -> tuple[int, list[str]]:
    """Twice the workers, as far as the memory allows; the notes of what limits the gain."""
    more = 2 * b.workers
    notes = [
        "synthesis scaled by upstream's measured contention (1, 2, 5, 7, 10, 12 workers: "
        'docs/daemon.md, "Measured figures"; another machine\'s cores and memory bandwidth '
        "may differ)"
    ]
    if shape.max_workers is not None and shape.max_workers < more:
        more = max(b.workers, shape.max_workers)
        notes.append(f"the memory allows {shape.max_workers} partition workers")
    if more > contention.MEASURED_UP_TO:
        notes.append(
            f"past {contention.MEASURED_UP_TO} workers the table has no row: its "
            f"{contention.MEASURED_UP_TO}-worker rate assumed (more than ~16 is said to be slower)"
        )
    if more > b.partitions * b.concurrency:
        notes.append(
            f"{b.concurrency} proofs in flight hold {b.partitions * b.concurrency} partitions: "
            "workers beyond them idle"
        )
    if b.cpu is not None and b.cpu >= CPU_FULL:
        notes.append(f"the CPU was busy {b.cpu * 100:.0f} %: more workers share the same cores")
    return more, notes
