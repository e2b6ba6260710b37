"""The simulated daemon's own record of its jobs, in its own simulated time (``--timeline FILE``).

A client's rate can be judged against it: the pipeline runs at exact simulated times (a callback
the event loop runs late is processed at its ideal time), so ``completed_s`` is what the machine
delivered whatever the load, and ``starved_s`` is the idle capacity a prompter client would have
filled. One JSON object per line, appended; every daemon process started with the same file adds
to it, ``pid`` telling them apart. Times are simulated seconds since that process's engine started
(divide by ``time_scale`` for real seconds), written exactly (not rounded) so a replay meets the
same ties as the engine did.

The records and their fields: docs/simulator.md, "Timeline". A ``start`` record when the engine
starts; a ``job`` record when a job ends, and one with ``status`` ``admitted`` (the times not
known yet null) when a PoRep job enters the pipeline, so a job a crash cut short is on record
too. Replayed in ``sim.daemon.pipeline.Pipeline`` (the start record's slots and GPU workers, each
PoRep job submitted at its ``admitted_s``) they give the same ``completed_s``. A file that cannot
be written is one ``WARN`` line; the daemon goes on without its timeline. :func:`read_timeline`
reads one back (tests/faults/ratecheck.py judges a client's rate with it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzk_supervisor.sim.daemon.logfmt import DaemonLog

TARGET = "cuzk_sim::timeline"


def starved_s(arrived: float, hungry_since: float | None, last_answered: float) -> float:
    """Idle capacity before a job that arrived at ``arrived``: the time since the pipeline went
    hungry (``hungry_since``, None if it was not) and the latest result was answered."""
    if hungry_since is None:
        return 0.0
    return max(0.0, arrived - max(hungry_since, last_answered))


@dataclass(frozen=True, slots=True)
class JobTimes:
    """One finished job's times on its daemon's simulated clock (the ``job`` record's fields)."""

    seq: int
    job_id: str
    kind: str
    status: str
    """``admitted`` (still running), ``completed`` or ``failed``."""
    arrived_s: float
    admitted_s: float | None
    reply_to: int | None
    started_s: float | None
    completed_s: float | None
    answered_s: float | None
    starved_s: float

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job record read back, with its process's start record."""

    pid: int
    times: JobTimes
    time_scale: float
    synthesis_slots: int
    gpu_workers: int
    origin_unix: float

    def unix(self, t: float) -> float:
        """A simulated time of this job's process as a Unix time."""
        return self.origin_unix + t / self.time_scale


class Timeline:
    """Appends records to ``path`` (opened per record: a killed daemon leaves whole lines)."""

    def __init__(self, path: Path, log: DaemonLog) -> None:
        self.path = path
        self._log = log
        self._broken = False
        self._pid = os.getpid()

    def start(self, *, time_scale: float, synthesis_slots: int, gpu_workers: int) -> None:
        """At the engine's start, when its simulated clock reads 0."""
        self._write(
            {
                "event": "start",
                "pid": self._pid,
                "time_scale": time_scale,
                "synthesis_slots": synthesis_slots,
                "gpu_workers": gpu_workers,
                "origin_unix": round(time.time(), 6),
            }
        )

    def job(self, times: JobTimes) -> None:
        # Exact floats (JSON keeps every bit): a job the engine admitted at the very instant a
        # partition finished must replay after that completion, and rounded times could put it
        # before, which changes how many partitions start together and so every later time.
        self._write({"event": "job", "pid": self._pid, **dataclasses.asdict(times)})

    def _write(self, record: dict[str, object]) -> None:
        if self._broken:
            return
        try:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        except OSError as exc:
            self._broken = True
            self._log.warn(TARGET, "cannot write the timeline, going on without it",
                           path=str(self.path), error=str(exc))  # fmt: skip


def read_timeline(path: Path) -> list[JobRecord]:
    """Each job's latest record (an ended job's, else its admission), in the order they first
    appear, with its process's start record (a job of a process whose start record is missing,
    or a torn line, is skipped)."""
    starts: dict[int, dict[str, Any]] = {}
    jobs: dict[tuple[int, int], JobRecord] = {}
    names = {f.name for f in dataclasses.fields(JobTimes)}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a daemon killed mid-write
        if record.get("event") == "start":
            starts[record["pid"]] = record
        elif record.get("event") == "job" and record.get("pid") in starts:
            start = starts[record["pid"]]
            times = JobTimes(**{k: record[k] for k in names})
            jobs[record["pid"], times.seq] = JobRecord(
                pid=record["pid"], times=times, time_scale=start["time_scale"],
                synthesis_slots=start["synthesis_slots"], gpu_workers=start["gpu_workers"],
                origin_unix=start["origin_unix"])  # fmt: skip
    return list(jobs.values())
