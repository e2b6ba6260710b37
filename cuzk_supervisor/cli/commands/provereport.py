"""What ``prove`` prints about finished proofs: one line per proof, the summary, the JSON
document, and the rate in the daemon's own time (pure functions of the results).

The daemon's time: each completed proof carries the daemon's ``total_ms`` (from taking the job
to the end). Against the wall time of the same stretch (our submit's answer to the result) it
gives daemon seconds per wall second: about 1 on real hardware, ``--time-scale`` on the
simulator. The batch's wall time in daemon seconds then gives proofs per hour as the daemon
counts them: the figure to compare with a real machine when the daemon is simulated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.adapters.proving.results import BatchResult, ProofResult
from cuzk_supervisor.core.bound import Shape, StatusSample, Verdict, judge


@dataclass(frozen=True, slots=True)
class DaemonTime:
    """The batch measured in the daemon's clock."""

    seconds_per_second: float  # daemon seconds per wall second, over the completed proofs
    wall_s: float  # the batch's wall time, in daemon seconds
    proofs_per_hour: float  # completed proofs per hour of daemon time

    def to_dict(self) -> dict[str, float]:
        return {
            "daemon_seconds_per_second": round(self.seconds_per_second, 4),
            "daemon_wall_s": round(self.wall_s, 3),
            "daemon_proofs_per_hour": round(self.proofs_per_hour, 3),
        }


def daemon_time(results: Sequence[ProofResult], batch_wall_s: float) -> DaemonTime | None:
    """The batch in daemon time, or None when no completed proof gave its ``total_ms``."""
    daemon_s, wall_s, completed = 0.0, 0.0, 0
    for result in results:
        if not result.ok:
            continue
        completed += 1
        if result.timings.total_ms <= 0:
            continue
        since = result.landed_at if result.landed_at is not None else result.started_at
        daemon_s += result.timings.total_ms / 1000.0
        wall_s += result.finished_at - since
    if daemon_s <= 0 or wall_s <= 0 or batch_wall_s <= 0:
        return None
    scale = daemon_s / wall_s
    batch_daemon_s = batch_wall_s * scale
    return DaemonTime(scale, batch_daemon_s, completed / batch_daemon_s * 3600.0)


def proof_line(index: int, count: int, result: ProofResult) -> str:
    line = (
        f"proof {index + 1}/{count} {result.job_id} "
        f"{'ok' if result.ok else 'failed'} "
        f"wall {result.wall_s:.1f} s daemon {result.timings.total_ms / 1000:.1f} s"
        f" submissions {result.submissions}"
    )
    if result.uploads_cut:
        line += f" uploads_cut {result.uploads_cut}"
    if not result.ok:
        line += f" error: {result.error}"
    return line


def totals(batch: BatchResult) -> dict[str, int]:
    """``submissions``: SubmitProof calls the daemon saw (its own count agrees);
    ``uploads_cut``: submits cut before they landed (then found NOT_FOUND), counted apart."""
    return {
        "submissions": sum(r.submissions for r in batch.results),
        "uploads_cut": sum(r.uploads_cut for r in batch.results),
    }


def summary_line(batch: BatchResult, measured: DaemonTime | None) -> str:
    s = batch.summary
    counts = totals(batch)
    daemon = (
        f"daemon time {measured.wall_s:.1f} s (x{measured.seconds_per_second:.2f}), "
        f"{measured.proofs_per_hour:.2f} proofs/hour in daemon time"
        if measured is not None
        else "daemon time unknown"
    )
    return (
        f"summary: {s.completed} completed, {s.failed} failed, wall {s.wall_s:.1f} s, "
        f"{s.proofs_per_hour:.2f} proofs/hour; {daemon} (count {s.count}, concurrency "
        f"{s.concurrency}, submissions {counts['submissions']}, uploads cut "
        f"{counts['uploads_cut']})"
    )


def config_workers(document: Mapping[str, Any]) -> int | None:
    """``[synthesis] partition_workers`` (what ``run`` renders for both releases), else the
    budget release's ``[pipeline] max_parallel_synthesis``; None when neither is there."""
    for table, key in (("synthesis", "partition_workers"), ("pipeline", "max_parallel_synthesis")):
        section = document.get(table)
        value = section.get(key) if isinstance(section, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def bound(
    samples: Sequence[StatusSample],
    concurrency: int,
    window: tuple[float, float],
    workers: int | None,
    source: str,
    rate_per_hour: float | None,
) -> Verdict:
    """What bounded the batch's rate (:func:`cuzk_supervisor.core.bound.judge`), against the
    partition workers ``source`` gave (None: not known) and the GPUs the samples show."""
    gpus = len({w.gpu_ordinal for sample in samples for w in sample.gpu_workers}) or 1
    shape = Shape(workers or 0, concurrency, gpus, workers_source=source)
    return judge(samples, shape, window=window, rate_per_hour=rate_per_hour)


def summary_fields(
    batch: BatchResult, measured: DaemonTime | None, verdict: Verdict | None = None
) -> dict[str, Any]:
    """The summary as flat fields (the ``prove.summary`` event and the JSON document)."""
    fields: dict[str, Any] = {**batch.summary.to_dict(), **totals(batch)}
    if verdict is not None:
        fields["bound"] = verdict.to_dict()
    if measured is not None:
        fields.update(measured.to_dict())
    else:
        fields.update(
            daemon_seconds_per_second=None, daemon_wall_s=None, daemon_proofs_per_hour=None
        )
    return fields


def summary_document(
    address: str, batch: BatchResult, measured: DaemonTime | None, verdict: Verdict | None = None
) -> dict[str, Any]:
    return {
        "address": address,
        **summary_fields(batch, measured, verdict),
        "proofs": [r.to_dict() for r in batch.results],
    }
