"""Memory trouble, acted on: the next plan (fewer workers, or what was measured to fit), then the
daemon replaced with it and the memory watch started over.

The decisions are in core (``step_down`` for the plan, :mod:`cuzk_supervisor.core.relaunch` for
the worker count, the fit and the plateau); this module asks the daemon how many partitions were
active when memory ran out, and carries the decisions out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from cuzk_supervisor import exitcodes
from cuzk_supervisor.core.memfit import MemoryFit
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.plan import GiveUpOOM, WorkerPlan, step_down
from cuzk_supervisor.core.relaunch import (
    expected_plateau,
    measured_fit,
    model_partition_bytes,
    peak_partition_bytes,
    proofs_running,
    relaunch_workers,
)
from cuzk_supervisor.core.risk import RiskAssessment, RiskPolicy
from cuzk_supervisor.lifecycle.shared import LifecycleFailure, Progress, Signals

log = structlog.get_logger()


class Watch(Protocol):
    """What a step-down reads of the memory watch and resets in it."""

    policy: RiskPolicy
    assessment: RiskAssessment | None
    base_bytes: int | None
    plateau_bytes: int | None

    def acknowledge(self) -> None: ...


class Daemon(Protocol):
    """What a step-down does to the daemon."""

    @property
    def workers(self) -> int | None: ...

    def forget_failures(self) -> None: ...

    async def replace(self, plan: WorkerPlan, workers: int) -> None: ...


@dataclass(eq=False, kw_only=True)
class StepDown:
    daemon: Daemon
    watch: Watch
    signals: Signals
    progress: Progress
    memory_policy: MemoryPolicy
    active_partitions: Callable[[], int | None]
    """Partitions synthesizing now, from the daemon's status (blocking: run in a thread)."""
    peak_per_partition: float | None = field(default=None, init=False)
    """The largest memory per partition measured at a step-down so far (outside the warmup):
    what a fit taken while memory still grows plans with at least."""

    async def next_plan(self, plan: WorkerPlan, cause: str) -> tuple[WorkerPlan, MemoryFit | None]:
        """The plan after ``cause``, and the fit it was measured from (None: one step down).
        Out of memory at one worker is the lifecycle's end (exit 5)."""
        running = self.daemon.workers
        fit = await self._measured_fit(plan, running)
        self.peak_per_partition = peak_partition_bytes(
            self.peak_per_partition, fit, self.progress.phase
        )
        result = step_down(
            plan, cause, self.memory_policy, running_workers=running,
            fitted=fit.workers if fit else None, fitted_reason=fit.reason if fit else "",
        )  # fmt: skip
        if isinstance(result, GiveUpOOM):
            raise LifecycleFailure(exitcodes.OUT_OF_MEMORY, f"out of memory: {result.reason}")
        self.progress.step_downs += 1
        log.warning(
            "plan.step_down",
            cause=cause,
            full_workers=result.full_workers,
            warmup_workers=result.warmup_workers,
        )
        return result, fit

    async def relaunch(self, plan: WorkerPlan, fit: MemoryFit | None) -> None:
        """Carry the adopted ``plan`` out: replace the daemon now, in any phase (it still holds
        the abandoned proof's memory, or its keeper is restarting it with the old plan after an
        OOM kill); only then start the watch over, so no sample of the old daemon counts."""
        if self.daemon.workers is not None:
            self.daemon.forget_failures()  # the OOM kills that led here are no crash loop
            workers = relaunch_workers(
                self.progress.phase,
                full_workers=plan.full_workers,
                warmup_workers=plan.warmup_workers,
            )
            await self.daemon.replace(plan, workers)
        self.signals.trouble.clear()
        self.watch.acknowledge()
        # The new plan's plateau, as measured: a ramp toward it is not a march to OOM.
        self.watch.plateau_bytes = expected_plateau(fit, plan.full_workers)
        self.signals.acted.set()

    async def _measured_fit(self, plan: WorkerPlan, running: int | None) -> MemoryFit | None:
        """What fits, from the memory the running plan was measured to use (None: one step).
        While memory was still growing, aimed at the partitions' plateau (core.memfit)."""
        assessment, base = self.watch.assessment, self.watch.base_bytes
        if assessment is None or base is None or running is None:
            log.info("memory.no_fit", reason="no daemon or no idle base measured yet")
            return None
        active = await asyncio.to_thread(self.active_partitions)
        progress, stretch = self.progress, self.progress.stretch
        running_proofs = proofs_running(
            progress.phase, stretch.in_flight if stretch is not None else None,
            daemon_running=self.signals.trouble_daemon_running,
        )  # fmt: skip
        fit = measured_fit(
            limit_bytes=assessment.limit_bytes, used_bytes=assessment.used_bytes, base_bytes=base,
            active_partitions=active, running_workers=running,
            # Where the watch reads ok again: a plan that fits keeps the level there.
            target_headroom=self.watch.policy.warn_exit_headroom,
            slope_bytes_per_s=assessment.slope_bytes_per_s,
            peak_per_partition=self.peak_per_partition,
            model_per_partition=model_partition_bytes(
                self.memory_policy, plan.inputs.memory_scale
            ),
            proofs_running=running_proofs,
        )  # fmt: skip
        if fit is not None:
            log.info("memory.fit", workers=fit.workers, reason=fit.reason,
                     plateau_bytes=fit.plateau, per_partition_bytes=round(fit.per_partition),
                     measured_per_partition_bytes=round(fit.measured_per_partition),
                     per_partition_source=fit.source,
                     active_estimated=fit.active_estimated)  # fmt: skip
        else:
            # Why the step is one worker: the operator reads it beside plan.step_down.
            log.info("memory.no_fit", active_partitions=active, used_bytes=assessment.used_bytes,
                     base_bytes=base, proofs_running=running_proofs,
                     reason="no partition known active, or no growth over the base")  # fmt: skip
        return fit
