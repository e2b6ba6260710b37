"""The pipeline's events told to the status tracker where engine.rs tells its own
(``sim.daemon.statustrack``), and what NVML would say of each simulated GPU.

:func:`track` is called for every pipeline event, the events of a failed job included (its
partitions still synthesizing finish, and a GPU worker still picks them up: the tracker sees
it all, as the real one does). :class:`GpuUse` keeps each device's CUDA intervals: its
``utilisation`` is the share of the last :data:`UTILISATION_WINDOW_S` a CUDA kernel ran, as
NVML's ``utilization.gpu`` is the share of its last sample period.
"""

from __future__ import annotations

from collections import deque

from cuzk_supervisor.sim.daemon.pipeevents import (
    CudaFinished,
    CudaStarted,
    Event,
    GpuFinished,
    GpuStarted,
    Started,
    SynthesisFailed,
    Synthesized,
)
from cuzk_supervisor.sim.daemon.statustrack import StatusTracker

UTILISATION_WINDOW_S = 10.0
"""Simulated seconds NVML's utilisation looks back over (a sample period of the real driver is
1/6 to 1 s against partitions of seconds; a longer window keeps the simulated figure from
reading only 0 or 1)."""


def track(tracker: StatusTracker, job_id: str, event: Event) -> None:
    """Tell the tracker what ``event`` (of the job ``job_id``) is in status.rs's terms."""
    at = event.at
    if isinstance(event, Started):
        tracker.partition_synth_start(job_id, event.part.index, at)
    elif isinstance(event, SynthesisFailed):
        tracker.partition_failed(job_id, event.part.index)
    elif isinstance(event, Synthesized):
        tracker.partition_synth_end(job_id, event.part.index, at)
    elif isinstance(event, GpuStarted):
        tracker.partition_gpu_start(job_id, event.part.index, event.worker, at)
    elif isinstance(event, GpuFinished):
        tracker.partition_gpu_end(job_id, event.part.index, event.worker, at)


class GpuUse:
    """Each device's CUDA busy time over a trailing window (the sim's NVML utilisation)."""

    def __init__(self, devices: int, workers_per_device: int) -> None:
        self.per = max(1, workers_per_device)
        self.running: list[float | None] = [None] * max(1, devices)  # CUDA start, if running
        self.ended: list[deque[tuple[float, float]]] = [deque() for _ in self.running]

    def on_event(self, event: Event) -> None:
        if isinstance(event, CudaStarted):
            self.running[event.worker // self.per] = event.at
        elif isinstance(event, CudaFinished):
            device = event.worker // self.per
            start = self.running[device]
            self.running[device] = None
            if start is not None:
                self.ended[device].append((start, event.at))

    def utilisation(self, device: int, now: float) -> float:
        since = now - UTILISATION_WINDOW_S
        spans = self.ended[device]
        while spans and spans[0][1] <= since:
            spans.popleft()
        busy = sum(min(end, now) - max(start, since) for start, end in spans if end > since)
        start = self.running[device]
        if start is not None:
            busy += now - max(start, since)
        return min(1.0, max(0.0, busy / UTILISATION_WINDOW_S))
