"""What ``prove`` reports while it waits: events at a fixed cadence.

A real warmup proof is minutes of silence from the daemon, so ``prove`` speaks for it: every
``PROGRESS_INTERVAL_S`` an event, ``prove.waiting`` until the daemon answers and
``prove.progress`` while proofs run (elapsed time, proofs done, failed and in flight, the
running proof's age and, when the daemon's HTTP status lists it, its partitions done). On a
terminal the view (``cuzk_supervisor.cli.viewprove``) turns them into its live line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from cuzk_supervisor.adapters.proving.batch import Prover
from cuzk_supervisor.adapters.proving.results import ProofResult
from cuzk_supervisor.proto import proving_pb2 as pb

PROGRESS_INTERVAL_S = 5.0
"""docs/commands.md promises progress at least every 10 s: twice that often."""

EVENT_STARTED = "prove.started"
EVENT_WAITING = "prove.waiting"
EVENT_PROGRESS = "prove.progress"
EVENT_SUMMARY = "prove.summary"

log = structlog.get_logger("cuzk_supervisor.prove")


@dataclass(slots=True)
class Tracker:
    """A :class:`Prover` that remembers which proofs are in flight and how many ended."""

    prover: Prover
    clock: Callable[[], float] = time.monotonic
    running: dict[str, float] = field(default_factory=dict)  # request id -> its start
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
    """The ``prove.progress`` fields; ``partitions``: job id -> (done, total), the daemon's."""
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


def waiting_fields(*, address: str, waited_s: float, deadline_s: float) -> dict[str, Any]:
    return {"address": address, "waited_s": round(waited_s, 1), "deadline_s": deadline_s}


class Ticker:
    """Logs ``snapshot()`` as ``event`` every ``interval_s``, awaiting ``refresh`` (optional)
    before each, e.g. to read the daemon's partitions."""

    def __init__(
        self,
        event: str,
        snapshot: Callable[[], dict[str, Any]],
        *,
        interval_s: float | None = None,
        refresh: Callable[[], Any] | None = None,
    ) -> None:
        self.event = event
        self.snapshot = snapshot
        # Read when made, so tests may shorten the cadence.
        self.interval_s = PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self.refresh = refresh

    async def run(self) -> None:
        next_event = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_event - time.monotonic()))
            # A steady schedule; after a stall (a suspended process) start it again from now.
            now = time.monotonic()
            next_event = max(next_event + self.interval_s, now + self.interval_s / 2)
            if self.refresh is not None:
                await self.refresh()
            log.info(self.event, **self.snapshot())
