"""The health policy's rules (:mod:`.health`), one function each over its own memory. Pure.

- :func:`count_proofs`: the daemon's lives (a new start begins its totals at 0) and the proofs
  completed and failed since the previous observation;
- :func:`proofs_failing`: failed proofs in a row, none completed between;
- the GPUs' rules are in :mod:`.healthgpu`;
- :func:`stuck_partitions`: a partition in the GPU stage for far longer than measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cuzk_supervisor.core.healthevidence import DaemonView, Observation, ProofTotals

if TYPE_CHECKING:
    from cuzk_supervisor.core.healthpolicy import HealthPolicy

REFERENCE_SAMPLES = 64
"""GPU stage times kept as the reference of a stuck partition (the latest)."""
HISTORY = 4096
"""Completion counts kept to say what the machine delivered since a finding began."""
XID_FELL_OFF_BUS = 79
ECC_XIDS = frozenset({48, 94, 95})
"""Double-bit ECC error; contained and uncontained ECC errors (A100 and later)."""
PAGE_XIDS = frozenset({63, 64})
"""A page retirement (or row remapping) recorded, or failed to be recorded."""
GPU_LOST = "gpu-lost"
ECC = "ecc"
PAGES_RETIRED = "pages-retired"
PROOFS_FAILING = "proofs-failing"
STUCK = "stuck-partition"
THROTTLED = "throttled"


@dataclass(frozen=True, slots=True)
class RawFinding:
    kind: str
    level: int
    since: float
    reason: str
    restart_helps: bool = False
    gpu: int | None = None
    latest: float | None = None
    """The latest evidence (None: ``since``): what it delivered is counted from there."""


def duration(seconds: float) -> str:
    """A span for a person: ``15 ms``, ``45 s``, ``12 min``, ``1.5 h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class Counts:
    """This observation's news: proofs completed and failed since the previous one."""

    completed: int = 0
    failed: int = 0
    new_life: bool = False


@dataclass(frozen=True, slots=True)
class Life:
    number: int = 0
    """Daemon lives seen since the watch started (0 for the first)."""
    starts: int | None = None
    uptime_s: float | None = None
    totals: ProofTotals | None = None
    view: tuple[int, int] | None = None
    """The HTTP counters last seen: (completed, failed self-checks)."""
    completed: int = 0
    """Proofs completed since the watch started, across lives."""
    history: tuple[tuple[float, int], ...] = ()
    """(when, ``completed``) at each observation that saw completions, the latest kept."""

    def completed_since(self, since: float) -> int | None:
        """Proofs completed after ``since``; None when that is older than what is kept."""
        if not self.history or since >= self.history[-1][0]:
            return 0
        before = [count for at, count in self.history if at <= since]
        if before:
            return self.completed - before[-1]
        if len(self.history) >= HISTORY:
            return None
        return self.completed


def count_proofs(life: Life, obs: Observation) -> tuple[Life, Counts]:
    view = obs.daemon
    new_life = life.starts is not None and obs.daemon_starts != life.starts
    if view is not None and life.uptime_s is not None and view.uptime_s < life.uptime_s:
        new_life = True
    totals, counters = life.totals, life.view
    if obs.totals is not None and totals is not None and obs.totals.completed < totals.completed:
        new_life = True
    if new_life:  # the new process counts from 0
        totals, counters = ProofTotals(0, 0), (0, 0)
    first = life.starts is None
    completed = failed = 0
    now_counters = (view.completed, view.self_check_failures) if view is not None else None
    if not first and obs.totals is not None and totals is not None:
        completed = max(0, obs.totals.completed - totals.completed)
        failed = max(0, obs.totals.failed - totals.failed)
    elif not first and now_counters is not None and counters is not None:
        completed = max(0, now_counters[0] - counters[0])
        failed = max(0, now_counters[1] - counters[1])
    total = life.completed + completed
    history = life.history
    if completed:
        history = (*history, (obs.at, total))[-HISTORY:]
    new = Life(
        number=life.number + (1 if new_life else 0),
        starts=obs.daemon_starts,
        uptime_s=view.uptime_s if view is not None else (None if new_life else life.uptime_s),
        # A source that did not answer has no baseline next time (no double count).
        totals=obs.totals,
        view=now_counters,
        completed=total,
        history=history,
    )
    return new, Counts(completed, failed, new_life)


@dataclass(frozen=True, slots=True)
class ProofStreak:
    failures: int = 0
    since: float | None = None
    before_restart: bool = False
    """The previous life of the daemon ended with proofs failing in a row."""


def proofs_failing(
    policy: HealthPolicy, streak: ProofStreak, life: Life, counts: Counts, at: float
) -> tuple[ProofStreak, list[RawFinding]]:
    failures, since, before = streak.failures, streak.since, streak.before_restart
    if counts.new_life:
        before = failures >= policy.failing_proofs or (before and failures == 0)
        failures, since = 0, None
    if counts.completed:
        failures, since, before = 0, None, False
    elif counts.failed:
        failures += counts.failed
        since = at if since is None else since
    new = ProofStreak(failures, since, before)
    if since is None or policy.failing_proofs <= 0 or failures < policy.failing_proofs:
        return new, []
    lasted = at - since
    what = f"{failures} proofs failed in a row, none completed, for {duration(lasted)}"
    if before:
        reason = f"every proof fails: {what}, as before the daemon's restart"
        return new, [RawFinding(PROOFS_FAILING, 2, since, reason)]
    if lasted >= policy.failing_s:
        return new, [RawFinding(PROOFS_FAILING, 2, since, what, restart_helps=True)]
    return new, [RawFinding(PROOFS_FAILING, 1, since, what)]


@dataclass(frozen=True, slots=True)
class PartitionMemory:
    reference: tuple[float, ...] = ()
    """GPU stage times (s) of partitions seen done: what a stuck one is measured against."""
    counted: frozenset[tuple[str, int]] = frozenset()
    in_gpu_since: Mapping[tuple[str, int], float] = field(default_factory=dict)
    stuck_since: Mapping[tuple[str, int], float] = field(default_factory=dict)
    tainted: frozenset[str] = frozenset()
    """Jobs listed when a failure was counted: any may be a failed job whose partitions the
    daemon leaves in ``gpu`` for ever (status.rs, engine.rs), so none is judged stuck."""
    last: tuple[RawFinding, ...] = ()
    """The findings of the latest status read (they stand while the status does not answer)."""

    def threshold(self, policy: HealthPolicy) -> tuple[float, float | None]:
        """(the stuck threshold, the measured GPU stage it comes from or None)."""
        if not self.reference:
            return policy.stuck_min_s, None
        measured = statistics.median(self.reference)
        return max(policy.stuck_min_s, policy.stuck_factor * measured), measured


def stuck_partitions(
    policy: HealthPolicy, mem: PartitionMemory, obs: Observation, failed: int
) -> tuple[PartitionMemory, list[RawFinding]]:
    view = obs.daemon
    if view is None:
        return mem, list(mem.last)
    listed = view.jobs()
    tainted = frozenset(j for j in mem.tainted if j in listed) | (listed if failed else set())
    dead = tainted | view.failed_jobs
    reference, counted = list(mem.reference), {k for k in mem.counted if k[0] in listed}
    for p in view.partitions:
        key = (p.job_id, p.index)
        if (
            p.state == "done"
            and p.gpu_s is not None
            and p.job_id not in dead
            and key not in counted
        ):
            counted.add(key)
            reference.append(p.gpu_s)
    in_gpu = [p for p in view.partitions if p.state == "gpu"]
    since = {(p.job_id, p.index): mem.in_gpu_since.get((p.job_id, p.index), obs.at) for p in in_gpu}
    kept = PartitionMemory(tuple(reference[-REFERENCE_SAMPLES:]), frozenset(counted), since, {},
                           tainted)  # fmt: skip
    threshold, measured = kept.threshold(policy)
    stuck: dict[tuple[str, int], float] = {}
    ages: dict[tuple[str, int], float] = {}
    for p in in_gpu:
        key = (p.job_id, p.index)
        age = max(p.gpu_s or 0.0, obs.at - since[key])
        if p.job_id not in dead and age >= threshold:
            stuck[key] = mem.stuck_since.get(key, obs.at)
            ages[key] = age
    found = _stuck_findings(view, stuck, ages, threshold, measured, policy)
    new = PartitionMemory(kept.reference, kept.counted, since, stuck, tainted, tuple(found))
    return new, found


def _stuck_findings(
    view: DaemonView,
    stuck: Mapping[tuple[str, int], float],
    ages: Mapping[tuple[str, int], float],
    threshold: float,
    measured: float | None,
    policy: HealthPolicy,
) -> list[RawFinding]:
    on: dict[tuple[str, int], int] = {
        (w.job_id, w.partition): w.gpu
        for w in view.workers
        if w.proving and w.job_id is not None and w.partition is not None
    }
    by_gpu: dict[int | None, list[tuple[str, int]]] = {}
    for key in stuck:
        by_gpu.setdefault(on.get(key), []).append(key)
    least = duration(policy.stuck_min_s)
    rule = f"nothing measured yet: {least}"
    if measured is not None:
        rule = f"{policy.stuck_factor:g}x the measured {duration(measured)}, at least {least}"
    found = []
    for gpu, keys in sorted(by_gpu.items(), key=lambda item: -1 if item[0] is None else item[0]):
        longest = max(keys, key=lambda k: ages[k])
        where = f"GPU {gpu}" if gpu is not None else "the GPU stage"
        many = f"{len(keys)} partitions, the longest " if len(keys) > 1 else ""
        reason = (
            f"{many}partition {longest[1]} of job {longest[0]} stuck on {where} for "
            f"{duration(ages[longest])} (threshold {duration(threshold)}: {rule})"
        )
        since = min(stuck[k] for k in keys)
        found.append(RawFinding(STUCK, 1, since, reason, restart_helps=True, gpu=gpu))
    return found


def busy_gpus(view: DaemonView | None, tainted: frozenset[str]) -> frozenset[int]:
    """The GPUs a worker of which proves a partition of a job not known to have failed."""
    if view is None:
        return frozenset()
    return frozenset(w.gpu for w in view.workers if view.gpu_loaded(w.gpu, tainted))
