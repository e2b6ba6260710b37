"""How many partition workers fit, from what memory was measured to do (incident I4).

Pure. After the first critical memory event the next plan is not "one worker fewer" but what the
measurement says fits: the memory each active partition takes above the daemon's idle base, held
against the limit with the headroom the risk watch wants to keep. Sizes are in one unit of the
caller's choosing (the watch's measured bytes).

The fit aims at the plateau the partitions level off at. A partition counts as active (the
daemon's ``synthesis.active``) from the moment it starts, but allocates its memory while it
synthesizes, so a sample taken while memory is still growing (the trend rule fired before the
headroom rule) sees the active partitions only partly allocated: per partition it reads low
(about 15 % in the cgroup end-to-end test) and the fit plans too many workers. Such a sample is a
lower bound, not a plateau. :func:`plateau_per_partition` then plans with the largest of what is
known to be reached: the sample, the peak measured earlier, and the model's partition figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuzk_supervisor.core.checks import in_range, require_value

MIB = 2**20


@dataclass(frozen=True, slots=True)
class PartitionFigure:
    """The memory per partition a fit plans with, and where it comes from."""

    bytes: float
    source: str
    """``"measured"``, ``"earlier peak"`` or ``"model"``."""
    why: str


def plateau_per_partition(
    measured: float, *, growing: bool, peak: float | None = None, model: float | None = None
) -> PartitionFigure:
    """The memory each partition levels off at, from a sample that measured ``measured`` per active
    partition over the base. Not ``growing`` (memory level over the trend window): the sample is a
    plateau, and the measurement is the figure. ``growing``: the active partitions may not have
    allocated all their memory yet, so the measurement is a lower bound, and the figure is the
    largest of it, ``peak`` (the largest per-partition figure measured earlier: the same proofs, so
    the same partitions) and ``model`` (the plan's figure for one partition): the conservative
    choice, each is something a partition was measured or modelled to reach."""
    if not growing:
        return PartitionFigure(measured, "measured", "memory level: a plateau")
    candidates = [(measured, "measured")]
    if peak is not None and peak > 0:
        candidates.append((peak, "earlier peak"))
    if model is not None and model > 0:
        candidates.append((model, "model"))
    figure, source = max(candidates, key=lambda c: c[0])
    known = ", ".join(f"{name} {value / MIB:.1f} MiB" for value, name in candidates)
    if source == "measured":
        why = f"memory still growing, the measurement the largest known ({known})"
    else:
        why = (
            f"memory still growing (the sample may be mid-ramp): planned with the {source}'s "
            f"{figure / MIB:.1f} MiB per partition, the largest known ({known})"
        )
    return PartitionFigure(figure, source, why)


@dataclass(frozen=True, slots=True)
class MemoryFit:
    workers: int
    """Partition workers whose plateau keeps ``target_headroom`` free (at least 1)."""
    per_partition: float
    """Planned with: the plateau figure (:func:`plateau_per_partition`)."""
    base: int
    plateau: int
    """Projected usage with ``workers`` partitions active: base + workers x per_partition."""
    reason: str
    measured_per_partition: float = 0.0
    """Measured: (used - base) / active partitions."""
    source: str = "measured"
    """Where ``per_partition`` comes from (:attr:`PartitionFigure.source`)."""
    active_estimated: bool = False
    """The active partitions were estimated, not read from the daemon's status."""


def fit_workers(
    *,
    limit: int,
    base: int,
    used: int,
    active_partitions: int,
    running_workers: int,
    target_headroom: float,
    growing: bool = False,
    peak_per_partition: float | None = None,
    model_per_partition: float | None = None,
) -> MemoryFit | None:
    """The workers that fit, measured at a moment of ``used`` with ``active_partitions``
    synthesizing over an idle ``base``; never more than ``running_workers - 1`` (a step down is a
    step down). None when the measurement cannot tell (nothing active, no growth over base).
    ``growing``: memory was still rising at the sample, so the partitions' plateau is planned from
    :func:`plateau_per_partition` with ``peak_per_partition`` and ``model_per_partition``."""
    if active_partitions < 1 or used <= base or limit <= 0 or running_workers < 1:
        return None
    require_value("fit_workers", "target_headroom", target_headroom, in_range(0, 1, high_open=True))
    measured = (used - base) / active_partitions
    figure = plateau_per_partition(
        measured, growing=growing, peak=peak_per_partition, model=model_per_partition
    )
    per = figure.bytes
    room = limit * (1 - target_headroom) - base
    fits = math.floor(room / per) if room > 0 else 0
    workers = max(1, min(running_workers - 1, fits))
    plateau = round(base + workers * per)
    reason = (
        f"measured {measured / MIB:.1f} MiB per active partition over a base of "
        f"{base / MIB:.0f} MiB ({active_partitions} active at {used / MIB:.0f} MiB)"
    )
    if growing:
        reason += f"; {figure.why}"
    reason += f": {fits} fit within {limit / MIB:.0f} MiB less {target_headroom:.0%} headroom"
    return MemoryFit(workers, per, base, plateau, reason, measured, figure.source)
