"""After memory trouble: what the daemon is started again with, and what memory to expect.

Pure. The step-down itself (how many workers the new plan has) is the plan policy's
``step_down``; this module decides the rest of the recovery:

- which of the new plan's worker counts the replacement daemon runs: in the warmup (and before
  it) the warmup plan is retried; from the restart on, the full plan (the PCE is built, so a
  step-down in the bench settles and measures at once);
- the fit measured from what the memory watch saw and the partitions the daemon had active
  (``core.memfit.fit_workers``), or none (then the plan steps down by one step);
- the plateau the new plan's usage is expected to level off at, so that a ramp toward it is not
  taken for a march to OOM.
"""

from __future__ import annotations

from cuzk_supervisor.core.memfit import MemoryFit, fit_workers

# Phases in which a step-down retries the warmup plan (the PCE is not built yet).
WARMUP_PHASES = frozenset({"plan", "warmup"})


def relaunch_workers(phase: str, *, full_workers: int, warmup_workers: int) -> int:
    """The worker count the daemon is restarted with after a step-down in ``phase``."""
    return warmup_workers if phase in WARMUP_PHASES else full_workers


def measured_fit(
    *,
    limit_bytes: int,
    used_bytes: int,
    base_bytes: int,
    active_partitions: int | None,
    running_workers: int,
    target_headroom: float,
) -> MemoryFit | None:
    """What fits, from the memory the running plan was measured to use; None: one step down
    (nothing active, the daemon's status not known, or no growth over the base)."""
    if not active_partitions:
        return None
    return fit_workers(
        limit=limit_bytes,
        base=base_bytes,
        used=used_bytes,
        active_partitions=active_partitions,
        running_workers=running_workers,
        target_headroom=target_headroom,
    )


def expected_plateau(fit: MemoryFit | None, full_workers: int) -> int | None:
    """Where the new plan's usage should level off, as measured (None: not measured)."""
    if fit is None:
        return None
    return round(fit.base + full_workers * fit.per_partition)
