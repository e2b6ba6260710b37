"""The free disk the param cache's file system needs before a run: the proof parameters and the
PCE files, less what is already there. Pure.

One figure for ``doctor`` and for the check before ``run`` (``cli.prestart``), so that both
refuse the same disk. Sizes on disk are measured bytes; the figures below are the real
machine's. Against the simulator (``plan_memory_scale`` != 1) the parameters and PCE files it
writes are scaled down like its memory, so the need is scaled down too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuzk_supervisor.core.units import GIB

PCE_FILES_BYTES = 25 * GIB
"""The budget release writes ~25 GiB of PCE files into ``[srs] param_cache`` on its first proof
(docs/daemon.md); the workers release keeps its PCE there too."""

PARAMS_BYTES = 100 * GIB
"""The 32 GiB-sector proof parameters (and their caches) are over 100 GiB on disk once fetched;
files that ``params_expected`` lists and that are already there at full size are subtracted."""

REQUIRED_FREE_BYTES = PCE_FILES_BYTES + PARAMS_BYTES
"""Free bytes the param cache's file system needs before a run on a fresh machine."""


@dataclass(frozen=True, slots=True)
class DiskNeed:
    """What is still to be written into the param cache, in measured bytes."""

    params_bytes: int
    """Parameters still to fetch."""
    pce_bytes: int
    """PCE files still to build."""
    present_bytes: int
    """Parameters already there at full size (measured), subtracted from ``params_bytes``."""
    params_verified: bool = False
    """An earlier run verified every parameter: none is still to fetch."""
    pce_built: bool = False
    """An earlier run built the PCE files: none is still to write."""
    scale: float = 1.0
    """``plan_memory_scale`` the figures were divided by (1 on a real machine)."""

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.pce_bytes


def disk_need(
    present_bytes: int,
    *,
    pce_built: bool = False,
    params_verified: bool = False,
    scale: float = 1.0,
) -> DiskNeed:
    """Free bytes needed: the PCE files (unless ``pce_built``) plus the parameters less
    ``present_bytes`` (measured bytes of parameter files already there at full size; none at
    all when ``params_verified``). ``scale`` is planned bytes per measured byte
    (``plan_memory_scale``): the figures are divided by it, rounded up (a need)."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    present = max(0, present_bytes)
    params = 0.0 if params_verified else max(0.0, PARAMS_BYTES - present * scale)
    pce = 0.0 if pce_built else float(PCE_FILES_BYTES)
    return DiskNeed(
        params_bytes=math.ceil(params / scale),
        pce_bytes=math.ceil(pce / scale),
        present_bytes=present,
        params_verified=params_verified,
        pce_built=pce_built,
        scale=scale,
    )
