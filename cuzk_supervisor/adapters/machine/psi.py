"""Pressure stall information (PSI): the value of one pressure file and its parser. The same
format is read per cgroup (v2 ``memory.pressure``) and for the whole system
(``/proc/pressure/memory``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Psi:
    """One pressure-stall file (``some`` and ``full`` lines); avg in percent, total in µs.
    ``full`` is None where the kernel prints only ``some``."""

    some_avg10: float
    some_avg60: float
    some_total: int
    full_avg10: float | None = None
    full_avg60: float | None = None
    full_total: int | None = None


def parse_psi(text: str | None) -> Psi | None:
    """``some avg10=0.00 avg60=0.00 avg300=0.00 total=0`` (+ a ``full`` line); None for no file
    or no ``some`` line."""
    if text is None:
        return None
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        lines[kind] = dict(f.partition("=")[::2] for f in rest.split())
    try:
        some = lines["some"]
        some_vals = (float(some["avg10"]), float(some["avg60"]), int(some["total"]))
    except (KeyError, ValueError):
        return None
    full = lines.get("full")
    full_vals: tuple[float | None, float | None, int | None] = (None, None, None)
    if full is not None:
        with contextlib.suppress(KeyError, ValueError):
            full_vals = (float(full["avg10"]), float(full["avg60"]), int(full["total"]))
    return Psi(*some_vals, *full_vals)
