"""Byte units and how sizes are written in reasons that people read. Pure."""

from __future__ import annotations

import math

GIB = 1 << 30
MIB = 1 << 20


def gib_to_bytes(gib: float) -> int:
    """GiB to bytes, rounded up: a need rounded down could plan one worker too many."""
    return math.ceil(gib * GIB)


def fmt_gib(n_bytes: float) -> str:
    """``"256 GiB"`` for (nearly) whole GiB, else one decimal (off by at most 0.05 GiB)."""
    value = n_bytes / GIB
    if abs(value - round(value)) < 0.05:
        return f"{round(value)} GiB"
    return f"{value:.1f} GiB"


def fmt_bytes(n_bytes: float) -> str:
    """GiB as :func:`fmt_gib`, MiB below 1 GiB (rates, and the simulator's small real sizes)."""
    if abs(n_bytes) >= GIB:
        return fmt_gib(n_bytes)
    return f"{n_bytes / MIB:.1f} MiB"


def planned_gib(measured_bytes: float, memory_scale: float, ndigits: int = 1) -> float:
    """Measured bytes as the GiB the plan reads them in, rounded for a person. ``memory_scale``
    is ``plan_memory_scale``, planned bytes per measured byte: 1 on a real machine; against the
    simulator the figure comes out in simulated GiB, as in the plan."""
    return round(measured_bytes * memory_scale / GIB, ndigits)
