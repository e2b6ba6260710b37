"""The monitors: the status line (and, with it, the kill look-up and the /running ping), the GPU
samples, and the memory watch turned into memory trouble.

The status loop is jittered (docs/architecture.md, rule 7): its first tick falls at a random point
of ``status_interval_s`` and each later one is varied by ``± manager_jitter``, so a fleet started
together does not push its status lines, ping or look up kills in the same second. Each monitor is
one task beside the phase machine (:meth:`Monitors.loops`); none decides anything about the
phases: they raise the shared signals (``trouble``, ``gone``) and the phase machine acts on them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import structlog

from cuzk_supervisor.adapters.machine.gpu import GpuProbe
from cuzk_supervisor.adapters.machine.resources import MemorySnapshot
from cuzk_supervisor.core.bench import interval_estimate_s, steady_rate_per_s
from cuzk_supervisor.core.jitter import JitteredSchedule
from cuzk_supervisor.core.units import planned_gib
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.values import MonitorSettings
from cuzk_supervisor.serve.metricsink import MetricsSink

log = structlog.get_logger()

Loop = Callable[[], Coroutine[Any, Any, None]]

CALL_STOP_S = 15.0
"""Longest a kill look-up or a ping holds the status loop."""


class ManagerView(Protocol):
    """What the status loop asks of the reporter."""

    async def look_up_kill(self, *, stop_s: float) -> str | None: ...

    def lookup_due(self, phase: str) -> bool: ...

    def ping_due(self) -> bool: ...

    async def ping(self, *, stop_s: float) -> bool: ...


class Restarts(Protocol):
    @property
    def restarts(self) -> int: ...


@dataclass(eq=False)
class Monitors:
    config: MonitorSettings
    _: KW_ONLY
    progress: Progress
    signals: Signals
    watch: MemoryWatch
    gpu: GpuProbe
    metrics: MetricsSink
    daemon: Restarts
    manager: ManagerView
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)

    def loops(self) -> list[Loop]:
        return [self.status_loop, self.watch.run, self.critical_memory, self.gpu_loop]

    @property
    def last_memory(self) -> MemorySnapshot | None:
        return self.watch.last

    # --- status lines ---------------------------------------------------------------------

    def status_fields(self) -> dict[str, Any]:
        progress = self.progress
        snapshot = self.watch.last
        now = self.clock()
        fields: dict[str, Any] = {
            "phase": progress.phase,
            "elapsed_s": round(now - progress.phase_started, 1),
            "proofs_done": progress.proofs_done,
            "proofs_failed": progress.proofs_failed,
            "headroom_gib": (
                planned_gib(snapshot.headroom, self.config.plan_memory_scale, 2)
                if snapshot
                else None
            ),
            "risk": self.watch.level.value,
            "restarts": self.daemon.restarts,
            "step_downs": progress.step_downs,
        }
        if progress.phase == "register" and progress.register_failures:
            retry_at = progress.register_retry_at
            fields.update(
                register_failures=progress.register_failures,
                register_retry_in_s=(
                    round(max(0.0, retry_at - now), 1) if retry_at is not None else None
                ),
            )
        stretch = progress.stretch
        if progress.phase == "bench" and stretch is not None:
            rate = steady_rate_per_s(stretch.completions)
            interval = interval_estimate_s(stretch)
            left = max(0, progress.bench_planned - len(stretch.completions))
            fields.update(
                bench_done=len(stretch.completions),
                bench_planned=progress.bench_planned,
                rate_so_far=round(rate * 3600 / self.config.rate_time_scale, 2) if rate else None,
                eta_s=round(left * interval, 1) if interval is not None else None,
            )
        fields["text"] = status_text(fields)
        return fields

    async def status_loop(self) -> None:
        """A status line at a steady (jittered) cadence, so a slow but healthy machine visibly
        is one; the manager's record looked up when a look-up is due (killed?); in the run phase
        the /running ping, at its own, slower cadence."""
        interval = self.config.status_interval_s
        schedule = JitteredSchedule(interval, self.config.manager_jitter, self.rng.random)
        # A look-up or ping holds the status line at most this long (while the manager is away
        # the shared backoff may hold a request longer: it is tried again at the next tick).
        stop_s = min(max(1.0, interval), CALL_STOP_S)
        while True:
            await asyncio.sleep(schedule.delay())
            log.info("supervisor.status", **self.status_fields())
            phase = self.progress.phase  # the reporter's LOOKUP_PHASES; in run, the ping
            if self.manager.lookup_due(phase):
                reason = await self.manager.look_up_kill(stop_s=stop_s)
                if reason is not None:
                    self.signals.mark_gone(reason)
                    return
            ping_due = phase == "run" and self.manager.ping_due()
            if ping_due and not await self.manager.ping(stop_s=stop_s):
                return

    # --- GPUs ------------------------------------------------------------------------------

    async def gpu_loop(self) -> None:
        """Sample GPU memory; a device error mid-run is a GPU fault event naming the device."""
        seen: set[tuple[int, str]] = set()
        while True:
            await asyncio.sleep(self.config.status_interval_s)
            if not self.gpu.available:
                continue
            # NVML can stall on a GPU in a bad state: never in the event loop.
            sample = await asyncio.to_thread(self.gpu.sample)
            self.metrics.gpus(sample.devices)
            for fault in sample.faults:
                if (fault.index, fault.error) in seen:
                    continue
                seen.add((fault.index, fault.error))
                log.error("gpu.fault", gpu=fault.index, error=fault.error)

    # --- memory -----------------------------------------------------------------------------

    async def critical_memory(self) -> None:
        """Critical memory is memory trouble (with ``proactive_oom``): flagged, then listened
        for again once the phase machine has stepped down and replaced the daemon."""
        while True:
            await self.watch.critical.wait()
            assessment = self.watch.assessment
            reason = assessment.reason if assessment else "memory critical"
            if self.config.proactive_oom:
                self.signals.flag_trouble(f"memory critical: {reason}", daemon_running=True)
                await self.signals.acted.wait()
                self.signals.acted.clear()
                continue
            log.warning("memory.critical_ignored", detail="proactive_oom is off", reason=reason)
            self.watch.critical.clear()


def status_text(fields: Mapping[str, Any]) -> str:
    """The status line in words, for a person on the dashboard."""
    parts = [f"{fields['phase']} for {fields['elapsed_s']:.0f}s"]
    if "bench_done" in fields:
        parts.append(f"{fields['bench_done']} of up to {fields['bench_planned']} proofs")
        if fields.get("rate_so_far") is not None:
            parts.append(f"{fields['rate_so_far']:.1f} proofs/h so far")
        if fields.get("eta_s") is not None:
            parts.append(f"about {fields['eta_s']:.0f}s to go")
    else:
        parts.append(f"{fields['proofs_done']} proofs done")
    if fields.get("register_failures"):
        wait = fields.get("register_retry_in_s")
        next_try = f", next try in {wait:.0f}s" if wait is not None else ""
        parts.append(f"register failed {fields['register_failures']} time(s){next_try}")
    if fields.get("headroom_gib") is not None:
        parts.append(f"{fields['headroom_gib']:.1f} GiB memory headroom ({fields['risk']})")
    if fields.get("step_downs"):
        parts.append(f"{fields['step_downs']} step-down(s)")
    return ", ".join(parts)
