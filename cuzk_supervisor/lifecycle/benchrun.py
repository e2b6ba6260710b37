"""One benchmark stretch against the daemon: the shell around :mod:`cuzk_supervisor.core.bench`.

Proofs are submitted while :func:`~cuzk_supervisor.core.bench.next_submission` says one more
fits the budget; each completion is stamped with the proving client's own monotonic time. The
stretch is kept in :class:`StretchRun` as it grows, so a caller that cancels the run (the daemon
restarted under it) still has every completion measured before the interruption.
:func:`bench_result` turns the measurement into what is logged, shipped and kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from cuzk_supervisor.adapters.machine.resources import MemorySnapshot
from cuzk_supervisor.adapters.proving.batch import Prover
from cuzk_supervisor.adapters.proving.results import ProofResult
from cuzk_supervisor.adapters.state.doc import BenchRecord
from cuzk_supervisor.core.bench import BenchPolicy, Stretch, next_submission
from cuzk_supervisor.core.benchreport import RateMeasurement
from cuzk_supervisor.core.bound import Verdict
from cuzk_supervisor.core.plan import WorkerPlan
from cuzk_supervisor.core.units import GIB, planned_gib
from cuzk_supervisor.proto import proving_pb2 as pb

log = structlog.get_logger("supervisor.bench")

ResultListener = Callable[[int, ProofResult, Stretch], None]


class StretchRun:
    """A stretch being run; ``stretch`` is its state so far (read it after a cancellation)."""

    def __init__(
        self,
        policy: BenchPolicy,
        workers: int,
        deadline: Callable[[], float],
        *,
        clock: Callable[[], float] = time.monotonic,
        daemon_seconds_per_second: float = 1.0,
    ) -> None:
        self.policy = policy
        self.daemon_seconds_per_second = daemon_seconds_per_second
        self.deadline = deadline
        """The end of the budget on ``clock`` (asked again at every decision: it can move when
        the manager's acknowledgement of /param-done arrives during the bench)."""
        self.clock = clock
        self.stretch = Stretch(workers=workers, concurrency=policy.held, started_at=clock())
        self.stop_reason = ""

    def completed_at(self, result: ProofResult) -> float:
        """When the daemon finished the proof, on our clock: its ``total_ms`` (from when it
        accepted the job) added to when the submit attempt that carried it began (``sent_at``),
        so a result seen late (a dropped or frozen connection, an await backing off) counts when
        it was done. The attempt's start, not its answer: a loop late to read answers (a daemon
        writing 50,000 lines a second on a loaded machine) read them up to a second late, and the
        rate came out 3 % high. Without timings, the time we saw it."""
        total_ms = result.timings.total_ms
        accepted = result.sent_at if result.sent_at is not None else result.landed_at
        if total_ms <= 0 or accepted is None:
            return result.finished_at
        done = accepted + total_ms / 1000 / self.daemon_seconds_per_second
        return min(result.finished_at, done)

    async def run(
        self,
        prover: Prover,
        template: pb.SubmitProofRequest,
        proof_budget_s: float | None,
        on_result: ResultListener | None = None,
    ) -> Stretch:
        """Submit, await and resubmit until the budget or ``max_proofs`` ends the stretch; return
        it once every proof in flight has ended. Cancelling cancels the proofs in flight."""
        running: dict[asyncio.Task[ProofResult], int] = {}

        def launch() -> None:
            request = pb.SubmitProofRequest()
            request.CopyFrom(template)
            # Every proof is its own job: the daemon does not de-duplicate request ids.
            request.request_id = str(uuid.uuid4())
            index = self.stretch.submitted
            self.stretch = self.stretch.submitted_one(self.clock())
            running[asyncio.ensure_future(prover.prove(request, proof_budget_s))] = index

        try:
            while True:
                in_flight = len(running)
                while in_flight < self.stretch.concurrency:
                    decision = next_submission(
                        self.stretch, self.clock(), self.deadline(), self.policy
                    )
                    if decision.closes:
                        self.stretch = self.stretch.close(decision.reason, decision.stop)
                    if not decision.submit:
                        if not self.stop_reason and "in flight" not in decision.reason:
                            self.stop_reason = decision.reason
                        break
                    launch()
                    in_flight += 1
                if not running:
                    return self.stretch
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: running[t]):
                    index = running.pop(task)
                    result = task.result()
                    if result.ok:
                        done_at = self.completed_at(result)
                        self.stretch = self.stretch.completed(done_at).landed(index, result.sent_at)
                    else:
                        self.stretch = self.stretch.failed_one()
                    if on_result is not None:
                        on_result(index, result, self.stretch)
        finally:
            for task in running:
                task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


@dataclass(frozen=True, slots=True)
class BenchResult:
    """The measured rate as it is logged (``bench.result``), shipped and kept."""

    rate: float
    """Proofs per hour in real time (the simulator's time scale divided out)."""
    figures: dict[str, Any]
    line: str
    """For the dashboard's benchout tab."""
    record: BenchRecord


def bench_result(
    measurement: RateMeasurement,
    plan: WorkerPlan,
    snapshot: MemorySnapshot,
    *,
    rate_time_scale: float,
    memory_scale: float,
    budget_left_s: float,
    step_downs: int,
    bound: Verdict | None = None,
) -> BenchResult:
    rate = measurement.rate_per_hour / rate_time_scale
    completed = measurement.proofs
    wall_s = measurement.interval_s
    how = {
        **measurement.to_dict(),
        "rate": round(rate, 3),
        "budget_left_s": round(budget_left_s, 1),
        "step_downs": step_downs,
    }
    figures = {
        "rate": round(rate, 3),
        "completed": completed,
        "wall_s": round(wall_s, 3),
        "workers": plan.full_workers,
        "gpus": plan.gpu_count,
        "vram_gib": [round(v / GIB, 1) for v in plan.gpu_vram_total_bytes],
        # Memory in the GiB the plan reads (simulated GiB against the simulator); VRAM is never
        # scaled (the simulator does not allocate it).
        "ram_gib": planned_gib(snapshot.host_total, memory_scale),
        "cgroup_limit_gib": (
            planned_gib(snapshot.cgroup_limit, memory_scale) if snapshot.cgroup_limit else None
        ),
        "measurement": how,
    }
    if bound is not None:
        figures["bound"] = bound.to_dict()
    known = f" ±{measurement.uncertainty:.1%}" if measurement.uncertainty is not None else ""
    stopped = f"; stopped: {measurement.stopped}" if measurement.stopped else ""
    line = (
        f"bench result: {rate:.2f}{known} proofs/hour from {completed} proofs over "
        f"{wall_s:.1f}s at concurrency {measurement.concurrency}, {measurement.workers} "
        f"workers; {measurement.reason}{stopped}; budget left {how['budget_left_s']}s"
    )
    record = BenchRecord(
        rate=rate, completed=completed, wall_s=wall_s, plan=plan.to_dict(), measurement=how,
        bound=bound.to_dict() if bound is not None else {},
    )  # fmt: skip
    return BenchResult(rate, figures, line, record)
