"""What ``prove`` shows while it waits: events at a fixed cadence and, on a terminal, a live line.

A real warmup proof is minutes of silence from the daemon, so ``prove`` speaks for it:

- every ``PROGRESS_INTERVAL_S`` (5 s) an event, ``prove.waiting`` while the daemon has not
  answered yet and ``prove.progress`` while proofs run (elapsed time, proofs done, failed and in
  flight, the running proof's age and, when the daemon's HTTP status lists it, its partitions
  done); off a terminal these are JSON lines like every other event;
- on a terminal also one line rewritten in place every ``LIVE_REFRESH_S`` (1 s), cleared
  before anything else is written, so results, warnings and errors stay readable.

The event names are constants: a terminal view maps them to screen lines.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import structlog

from cuzk_supervisor.adapters.provingbatch import Prover
from cuzk_supervisor.adapters.provingresults import ProofResult
from cuzk_supervisor.proto import proving_pb2 as pb

PROGRESS_INTERVAL_S = 5.0
"""Cadence of ``prove.waiting`` and ``prove.progress`` (documented in the README: progress at
least every 10 s, so twice that often)."""
LIVE_REFRESH_S = 1.0
"""Cadence of the live line on a terminal."""
STATUS_TIMEOUT_S = 1.0
"""Deadline of one ask of the daemon's HTTP status (partitions done): a figure, not a need."""
MAX_STATUS_BYTES = 1 << 20

EVENT_STARTED = "prove.started"
EVENT_WAITING = "prove.waiting"
EVENT_PROGRESS = "prove.progress"
EVENT_SUMMARY = "prove.summary"

log = structlog.get_logger("cuzk_supervisor.prove")


# --- what is in flight ------------------------------------------------------------------------


@dataclass(slots=True)
class Tracker:
    """A :class:`Prover` that remembers which proofs are in flight and how many ended."""

    prover: Prover
    clock: Callable[[], float] = time.monotonic
    running: dict[str, float] = field(default_factory=dict)
    """request id -> when its proof started."""
    completed: int = 0
    failed: int = 0

    async def prove(
        self, request: pb.SubmitProofRequest, budget_s: float | None = None
    ) -> ProofResult:
        job_id = request.request_id
        self.running[job_id] = self.clock()
        try:
            result = await self.prover.prove(request, budget_s)
        finally:
            self.running.pop(job_id, None)
        if result.ok:
            self.completed += 1
        else:
            self.failed += 1
        return result


def progress_fields(
    *,
    now: float,
    started: float,
    count: int,
    tracker: Tracker,
    partitions: Mapping[str, tuple[int, int]],
) -> dict[str, Any]:
    """The ``prove.progress`` fields (pure). ``partitions``: job id -> (done, total), from the
    daemon's status where it lists the job."""
    finished = tracker.completed + tracker.failed
    elapsed = now - started
    fields: dict[str, Any] = {
        "elapsed_s": round(elapsed, 1),
        "count": count,
        "done": tracker.completed,
        "failed": tracker.failed,
        "running": len(tracker.running),
        "proof": min(finished + 1, count),
    }
    if tracker.running:
        fields["proof_elapsed_s"] = round(now - min(tracker.running.values()), 1)
    known = [partitions[job] for job in tracker.running if job in partitions]
    if known:
        fields["partitions_done"] = sum(done for done, _ in known)
        fields["partitions_total"] = sum(total for _, total in known)
    if 0 < finished < count:
        fields["eta_s"] = round(elapsed / finished * (count - finished), 1)
    return fields


def duration(seconds: float) -> str:
    """``42s``, ``6m05s``, ``1h02m``: a duration as a person reads it on the live line."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_text(fields: Mapping[str, Any]) -> str:
    """The live line for ``prove.progress`` fields."""
    parts = [f"proof {fields['proof']}/{fields['count']}"]
    if "proof_elapsed_s" in fields:
        parts[0] += f" running {duration(fields['proof_elapsed_s'])}"
    if "partitions_done" in fields:
        parts.append(f"partitions {fields['partitions_done']}/{fields['partitions_total']}")
    parts.append(f"{fields['done']} done")
    if fields["failed"]:
        parts.append(f"{fields['failed']} failed")
    parts.append(f"elapsed {duration(fields['elapsed_s'])}")
    if "eta_s" in fields:
        parts.append(f"eta {duration(fields['eta_s'])}")
    return " · ".join(parts)


def waiting_fields(*, address: str, waited_s: float, deadline_s: float) -> dict[str, Any]:
    return {"address": address, "waited_s": round(waited_s, 1), "deadline_s": deadline_s}


def waiting_text(fields: Mapping[str, Any]) -> str:
    return (
        f"waiting for the daemon at {fields['address']}: "
        f"{duration(fields['waited_s'])} of {duration(fields['deadline_s'])}"
    )


# --- the daemon's HTTP status -----------------------------------------------------------------


def parse_partitions(document: object) -> dict[str, tuple[int, int]]:
    """job id -> (partitions done, partitions) from a ``/status`` document's ``pipelines``."""
    found: dict[str, tuple[int, int]] = {}
    pipelines = document.get("pipelines") if isinstance(document, dict) else None
    for pipeline in pipelines if isinstance(pipelines, list) else []:
        if not isinstance(pipeline, dict) or not isinstance(pipeline.get("job_id"), str):
            continue
        parts = pipeline.get("partitions")
        if not isinstance(parts, list) or not parts:
            continue
        done = sum(1 for p in parts if isinstance(p, dict) and p.get("state") == "done")
        found[pipeline["job_id"]] = (done, len(parts))
    return found


def read_partitions(status_listen: str) -> dict[str, tuple[int, int]]:
    """Partitions per job from ``http://<status_listen>/status``; empty when not known (no
    listener, a unix socket, a bad answer): a short timeout, no retries."""
    if not status_listen or status_listen.startswith("unix:"):
        return {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{status_listen}/status", timeout=STATUS_TIMEOUT_S) as answer:
            return parse_partitions(json.loads(answer.read(MAX_STATUS_BYTES)))
    except (OSError, ValueError):
        return {}


# --- the terminal -----------------------------------------------------------------------------

_CLEAR = "\r\x1b[K"


class LiveLine:
    """One line rewritten in place on a terminal; :meth:`clear` before writing anything else."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    def show(self, text: str) -> None:
        width = shutil.get_terminal_size((100, 24)).columns
        self.stream.write(_CLEAR + text[: max(width - 1, 10)])
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self.shown = False

    def processor(
        self, logger: object, method_name: str, event_dict: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        """A structlog processor: clears the line before an event is written under it."""
        self.clear()
        return event_dict


# --- the cadence ------------------------------------------------------------------------------


class Ticker:
    """Calls ``snapshot()`` for fields and reports them: an event every ``interval_s``, the live
    line (when there is one) every ``refresh_s``. ``refresh`` (async, optional) is awaited
    before each event, e.g. to read the daemon's partitions."""

    def __init__(
        self,
        event: str,
        snapshot: Callable[[], dict[str, Any]],
        text: Callable[[Mapping[str, Any]], str],
        *,
        live: LiveLine | None,
        interval_s: float | None = None,
        refresh_s: float | None = None,
        refresh: Callable[[], Any] | None = None,
    ) -> None:
        self.event = event
        self.snapshot = snapshot
        self.text = text
        self.live = live
        # Read when made, so tests may shorten the cadence.
        self.interval_s = PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self.refresh_s = min(LIVE_REFRESH_S if refresh_s is None else refresh_s, self.interval_s)
        self.refresh = refresh

    async def run(self) -> None:
        """Until cancelled."""
        next_event = time.monotonic() + self.interval_s
        while True:
            step = self.refresh_s if self.live is not None else self.interval_s
            await asyncio.sleep(max(0.0, min(step, next_event - time.monotonic())))
            now = time.monotonic()
            if now >= next_event:
                # A steady schedule; after a stall (a suspended process) start it again from now.
                next_event = max(next_event + self.interval_s, now + self.interval_s / 2)
                if self.refresh is not None:
                    await self.refresh()
                fields = self.snapshot()
                log.info(self.event, **fields)
            else:
                fields = self.snapshot()
            if self.live is not None:
                self.live.show(self.text(fields))

    def draw(self) -> None:
        """The live line now (at the start, and after something was printed over it)."""
        if self.live is not None:
            self.live.show(self.text(self.snapshot()))
