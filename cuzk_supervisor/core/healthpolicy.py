"""The run phase's health thresholds (issue 34), apart from the rules that read them so that
:mod:`.health`, :mod:`.healthrules` and :mod:`.healthgpu` import it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The thresholds (each a setting, ``health_*``; docs/run-phase.md)."""

    gpu_lost_s: float = 60.0
    """A GPU NVML cannot read for this long is lost (an XID 79 says so at once)."""
    failing_proofs: int = 3
    """This many failed proofs in a row (none completed between) is "proofs failing"."""
    failing_s: float = 900.0
    """Failing that long is broken (a restart of the daemon is tried first)."""
    stuck_factor: float = 10.0
    """A partition in ``gpu`` for this many times the measured GPU stage is stuck ..."""
    stuck_min_s: float = 120.0
    """... and at least this long (the threshold while nothing was measured)."""
    throttle_ratio: float = 0.5
    """A loaded GPU whose SM clock is at most this share of its maximum, held down by a
    slowdown reason (power cap, thermal, hardware slowdown), is throttled ..."""
    throttle_s: float = 3600.0
    """... and degraded once throttled for this long."""
    daemon_exits: int = 3
    """This many daemon exits (crashes, kills) within ``exit_window_s`` is degraded."""
    exit_window_s: float = 3600.0
