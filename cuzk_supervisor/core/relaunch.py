"""After memory trouble: what the daemon is started again with, and what memory to expect.

Pure. The step-down itself (how many workers the new plan has) is the plan policy's
``step_down``; this module decides the rest of the recovery:

- which of the new plan's worker counts the replacement daemon runs: in the warmup (and before
  it) the warmup plan is retried; from the restart on, the full plan (the PCE is built, so a
  step-down in the bench settles and measures at once);
- the fit measured from what the memory watch saw and the partitions the daemon had active
  (:func:`measured_fit`): as its status said, or, where it could not answer in time (a daemon
  under memory pressure is slow to), estimated (:func:`estimated_active_partitions`); while
  memory still grew, aimed at the partitions' plateau, not at the mid-ramp sample
  (:func:`model_partition_bytes`, :func:`peak_partition_bytes`); no fit: one step down;
- the plateau the new plan's usage is expected to level off at, so that a ramp toward it is not
  taken for a march to OOM.
"""

from __future__ import annotations

import dataclasses

from cuzk_supervisor.core.memfit import MemoryFit, fit_workers
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.units import GIB

# Phases in which a step-down retries the warmup plan (the PCE is not built yet).
WARMUP_PHASES = frozenset({"plan", "warmup"})
PARTITIONS_PER_POREP = 10
"""A 32 GiB PoRep proof's partitions (docs/daemon.md), each synthesized on one partition worker."""


def proofs_running(phase: str, bench_in_flight: int | None, *, daemon_running: bool) -> int:
    """The PoRep proofs the daemon was running when memory trouble came, as far as the lifecycle
    knows: the warmup's or the settle's one, the bench stretch's in flight (``bench_in_flight``,
    None when no stretch ran); none known in the run phase (the daemon's work there comes from
    outside), nor after an OOM kill (``daemon_running`` False: the sample before a kill may be
    far from what killed it, so the step stays one worker)."""
    if not daemon_running:
        return 0
    if phase == "bench":
        return bench_in_flight or 0
    return 1 if phase in ("warmup", "settle") else 0


def estimated_active_partitions(proofs_running: int, running_workers: int) -> int:
    """The partitions the daemon can have been synthesizing with ``proofs_running`` PoRep proofs
    in it: all of theirs, at most one per worker. An upper bound (some may have been through
    synthesis already), so the memory per partition it gives is a lower bound; a fit still plans
    with at least the model's figure while memory grows (``core.memfit.plateau_per_partition``),
    and a plan that proves too large is stepped down again at its next critical level."""
    return max(0, min(running_workers, proofs_running * PARTITIONS_PER_POREP))


def relaunch_workers(phase: str, *, full_workers: int, warmup_workers: int) -> int:
    """The worker count the daemon is restarted with after a step-down in ``phase``."""
    return warmup_workers if phase in WARMUP_PHASES else full_workers


def model_partition_bytes(policy: MemoryPolicy, memory_scale: float) -> float:
    """The plan's figure for one synthesizing partition, in measured bytes: what the daemon reserves
    per PoRep partition (``budget_partition_gib``, 14 GiB, the low end of the 14-16 GiB
    docs/daemon.md measured), over the plan's bytes per measured byte (the simulator's scale). Not
    the rule of thumb's 20 GiB per worker: that is the whole pipeline's peak with the rule's own
    error, and would overrule a partition that was measured to take less."""
    return policy.budget_partition_gib * GIB / memory_scale


def peak_partition_bytes(peak: float | None, fit: MemoryFit | None, phase: str) -> float | None:
    """The largest per-partition figure measured so far, with ``fit`` (taken in ``phase``). A fit
    taken in the warmup does not count: the PCE is not resident at the base there and its extraction
    is transient, so what it measured per partition is not a partition."""
    if fit is None or phase in WARMUP_PHASES:
        return peak
    return max(peak or 0.0, fit.measured_per_partition) or None


def measured_fit(
    *,
    limit_bytes: int,
    used_bytes: int,
    base_bytes: int,
    active_partitions: int | None,
    running_workers: int,
    target_headroom: float,
    slope_bytes_per_s: float | None = None,
    peak_per_partition: float | None = None,
    model_per_partition: float | None = None,
    proofs_running: int = 0,
) -> MemoryFit | None:
    """What fits, from the memory the running plan was measured to use; None: one step down (nothing
    active, neither the daemon's status nor ``proofs_running`` known, or no growth over the base).
    ``active_partitions`` None (the daemon did not say) with ``proofs_running``: the partitions
    those proofs can have had active (:func:`estimated_active_partitions`). ``slope_bytes_per_s`` is
    the assessment's growth rate: above 0, memory was still growing at the sample, and the fit plans
    with the plateau figure (the largest of the measurement, ``peak_per_partition`` and
    ``model_per_partition``; ``core.memfit.plateau_per_partition``)."""
    estimated = active_partitions is None
    if active_partitions is None:
        active_partitions = estimated_active_partitions(proofs_running, running_workers)
    if not active_partitions:
        return None
    fit = fit_workers(
        limit=limit_bytes,
        base=base_bytes,
        used=used_bytes,
        active_partitions=active_partitions,
        running_workers=running_workers,
        target_headroom=target_headroom,
        growing=slope_bytes_per_s is not None and slope_bytes_per_s > 0,
        peak_per_partition=peak_per_partition,
        model_per_partition=model_per_partition,
    )
    if fit is None or not estimated:
        return fit
    note = (
        f" (active partitions estimated from {proofs_running} proof(s) running: the daemon's "
        "status did not answer)"
    )
    return dataclasses.replace(fit, reason=fit.reason + note, active_estimated=True)


def expected_plateau(fit: MemoryFit | None, full_workers: int) -> int | None:
    """Where the new plan's usage should level off, as measured (None: not measured): the base
    and the partition figure the fit planned with."""
    if fit is None:
        return None
    return round(fit.base + full_workers * fit.per_partition)
