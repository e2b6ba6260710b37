"""The health policy's GPU rules (:mod:`.health`): what NVML showed. Pure.

A GPU lost (an XID 79, or NVML not answering it for ``gpu_lost_s``), uncorrectable ECC errors
(XID 48, 94, 95, the volatile uncorrected counter rising: a restart gives the daemon a new CUDA
context; in two daemon lives, the card is broken), retired pages (XID 63 or 64, a rising count
of pages retired for double-bit errors, a retirement pending until a reset: said), clocks held
down under load (at most ``throttle_ratio`` of the SM clock's maximum with a slowdown reason, on
a GPU busy by NVML's utilisation or, where that is not reported, by the daemon's status, for
``throttle_s``; an idle GPU's low clocks are never counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cuzk_supervisor.core.healthevidence import GpuView, Observation
from cuzk_supervisor.core.healthrules import (
    ECC,
    ECC_XIDS,
    GPU_LOST,
    PAGE_XIDS,
    PAGES_RETIRED,
    THROTTLED,
    XID_FELL_OFF_BUS,
    RawFinding,
    duration,
)

if TYPE_CHECKING:
    from cuzk_supervisor.core.healthpolicy import HealthPolicy


@dataclass(frozen=True, slots=True)
class GpuMemory:
    lost: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    """GPU -> (not answering NVML since, the error)."""
    fell_off: Mapping[int, float] = field(default_factory=dict)
    """GPU -> when its XID 79 came (it stays gone: only a reset brings it back)."""
    ecc: Mapping[int, tuple[tuple[float, int, str], ...]] = field(default_factory=dict)
    """GPU -> its uncorrectable ECC events: (when, daemon life, what); the first few kept."""
    counters: Mapping[int, tuple[int | None, int | None]] = field(default_factory=dict)
    """GPU -> (uncorrected ECC errors, retired pages) last read."""
    pages: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    throttled: Mapping[int, tuple[float, float | None, tuple[str, ...]]] = field(
        default_factory=dict
    )
    """GPU -> (held down under load since, its clock ratio, the reasons) as last seen."""


def _rose(now: int | None, before: int | None) -> int:
    return now - before if now is not None and before is not None and now > before else 0


def _read_gpu(
    policy: HealthPolicy, mem: GpuMemory, gpu: GpuView, at: float, life: int, loaded: bool
) -> GpuMemory:
    i = gpu.index
    lost, fell, ecc = dict(mem.lost), dict(mem.fell_off), dict(mem.ecc)
    counters, pages, throttled = dict(mem.counters), dict(mem.pages), dict(mem.throttled)
    if not gpu.answering:
        lost.setdefault(i, (at, gpu.error))
    else:
        lost.pop(i, None)
    if XID_FELL_OFF_BUS in gpu.xids:
        fell.setdefault(i, at)
    unc_before, ret_before = counters.get(i, (None, None))
    events = [f"XID {x}" for x in gpu.xids if x in ECC_XIDS]
    if rose := _rose(gpu.ecc_uncorrected, unc_before):
        events.append(f"{rose} uncorrected ECC error{'s' if rose > 1 else ''}")
    if events:
        ecc[i] = (*ecc.get(i, ()), (at, life, ", ".join(events)))[:8]
    retired = [f"XID {x}" for x in gpu.xids if x in PAGE_XIDS]
    if rose := _rose(gpu.retired_pages, ret_before):
        retired.append(f"{rose} more page{'s' if rose > 1 else ''} retired")
    if gpu.retirement_pending:
        retired.append("a page retirement pending (a GPU reset is needed)")
    if gpu.remap_failed:
        retired.append("a row remapping failed (the GPU's memory is failing)")
    if retired and i not in pages:
        pages[i] = (at, ", ".join(retired))
    counters[i] = (
        gpu.ecc_uncorrected if gpu.ecc_uncorrected is not None else unc_before,
        gpu.retired_pages if gpu.retired_pages is not None else ret_before,
    )
    ratio = gpu.sm_clock_ratio
    if gpu.answering and loaded and ratio is not None:
        # Held down: low clocks with a slowdown reason. Only clocks above the threshold under
        # load clear it: a reading between two bursts (low clocks, the idle reason) does not.
        if ratio <= policy.throttle_ratio and gpu.slowdowns:
            since = throttled.get(i, (at, None, ()))[0]
            throttled[i] = (since, ratio, gpu.slowdowns)
        elif ratio > policy.throttle_ratio:
            throttled.pop(i, None)
    return GpuMemory(lost, fell, ecc, counters, pages, throttled)


def gpu_conditions(
    policy: HealthPolicy, mem: GpuMemory, obs: Observation, life: int, busy: Iterable[int]
) -> tuple[GpuMemory, list[RawFinding]]:
    """What NVML showed; with no NVML reading this time, what it showed before still stands.
    ``busy``: the GPUs the daemon's status shows working on a live job."""
    loaded_by_daemon = set(busy)
    for gpu in obs.gpus or ():
        util = gpu.utilisation
        loaded = util >= 0.5 if util is not None else gpu.index in loaded_by_daemon
        mem = _read_gpu(policy, mem, gpu, obs.at, life, loaded)
    return mem, _gpu_findings(policy, mem, obs.at)


def _gpu_findings(policy: HealthPolicy, mem: GpuMemory, at: float) -> list[RawFinding]:
    found: list[RawFinding] = []
    for i in sorted({*mem.lost, *mem.fell_off}):
        error = mem.lost[i][1] if i in mem.lost else ""
        detail = f" ({error})" if error else ""
        if i in mem.fell_off:
            since = mem.fell_off[i]
            reason = f"GPU {i} fell off the bus (XID 79){detail}"
            found.append(RawFinding(GPU_LOST, 2, since, reason, gpu=i))
            continue
        since = mem.lost[i][0]
        lasted = at - since
        level = 2 if lasted >= policy.gpu_lost_s else 1
        reason = f"GPU {i} has not answered NVML for {duration(lasted)}{detail}"
        found.append(RawFinding(GPU_LOST, level, since, reason, gpu=i))
    for i, events in sorted(mem.ecc.items()):
        lives = {life for _, life, _ in events}
        what = "; ".join(text for _, _, text in events[:3])
        if len(lives) >= 2:
            reason = (
                f"uncorrectable ECC errors on GPU {i} before and after a daemon restart ({what})"
            )
            found.append(RawFinding(ECC, 2, events[0][0], reason, gpu=i, latest=events[-1][0]))
        else:
            reason = f"uncorrectable ECC error on GPU {i} ({what})"
            found.append(RawFinding(ECC, 1, events[0][0], reason, restart_helps=True, gpu=i))
    for i, (since, what) in sorted(mem.pages.items()):
        found.append(RawFinding(PAGES_RETIRED, 1, since, f"GPU {i}: {what}", gpu=i))
    for i, (since, ratio, reasons) in sorted(mem.throttled.items()):
        if at - since < policy.throttle_s:
            continue
        share = f"{ratio:.0%}" if ratio is not None else "a fraction"
        held, why = duration(at - since), ", ".join(reasons)
        reason = f"GPU {i} held at {share} of its SM clock under load for {held} ({why})"
        found.append(RawFinding(THROTTLED, 1, since, reason, gpu=i))
    return found
