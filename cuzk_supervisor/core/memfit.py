"""How many partition workers fit, from what memory was measured to do (incident I4).

Pure. After the first critical memory event the next plan is not "one worker fewer" but what the
measurement says fits: the memory each active partition takes above the daemon's idle base, held
against the limit with the headroom the risk watch wants to keep. Sizes are in one unit of the
caller's choosing (the watch's measured bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuzk_supervisor.core.checks import in_range, require_value


@dataclass(frozen=True, slots=True)
class MemoryFit:
    workers: int
    """Partition workers whose plateau keeps ``target_headroom`` free (at least 1)."""
    per_partition: float
    """Measured: (used - base) / active partitions."""
    base: int
    plateau: int
    """Projected usage with ``workers`` partitions active: base + workers x per_partition."""
    reason: str


def fit_workers(
    *,
    limit: int,
    base: int,
    used: int,
    active_partitions: int,
    running_workers: int,
    target_headroom: float,
) -> MemoryFit | None:
    """The workers that fit, measured at a moment of ``used`` with ``active_partitions``
    synthesizing over an idle ``base``; never more than ``running_workers - 1`` (a step down is
    a step down). None when the measurement cannot tell (nothing active, no growth over base)."""
    if active_partitions < 1 or used <= base or limit <= 0 or running_workers < 1:
        return None
    require_value("fit_workers", "target_headroom", target_headroom, in_range(0, 1, high_open=True))
    per = (used - base) / active_partitions
    room = limit * (1 - target_headroom) - base
    fits = math.floor(room / per) if room > 0 else 0
    workers = max(1, min(running_workers - 1, fits))
    plateau = round(base + workers * per)
    reason = (
        f"measured {per / 2**20:.1f} MiB per active partition over a base of "
        f"{base / 2**20:.0f} MiB ({active_partitions} active at {used / 2**20:.0f} MiB): "
        f"{fits} fit within {limit / 2**20:.0f} MiB less {target_headroom:.0%} headroom"
    )
    return MemoryFit(workers, per, base, plateau, reason)
