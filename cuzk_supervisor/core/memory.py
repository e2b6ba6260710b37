"""What a worker plan is made from: the memory figures (:class:`MemoryPolicy`), what was measured
(:class:`PlanInputs`) and their limit (:class:`EffectiveLimit`). Incident I4; docs/daemon.md.

The limit is the lower of host RAM and the cgroup limit (the container is not the host,
docs/architecture.md principle 8), less a safety margin; every number carries its reason. The plan
itself is :mod:`cuzk_supervisor.core.plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.core.checks import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    Rule,
    in_range,
    int_above,
    int_at_least,
    is_int,
    number_above,
    require_fields,
    require_value,
)
from cuzk_supervisor.core.units import GIB, MIB, fmt_gib, gib_to_bytes


@dataclass(frozen=True)
class MemoryPolicy:
    """The figures a worker plan is made from; all sizes in GiB.

    Safety margin: ``max(safety_margin_fraction × bound, safety_margin_min_gib)`` where the bound
    is ``min(host, cgroup)``. The default 25 % is not a guess about other processes: it is the
    measured error of the rule of thumb. At 12 workers docs/daemon.md (figures) measured a peak of
    373–400 GiB where ``69 + 20 × 12`` says 309 GiB (up to 91 GiB, 23 % of 400, more), and a 125 GB
    machine was OOM-killed at the rule's 2 workers (incident I4). With 25 % the plan for 128, 256,
    384 and 512 GiB hosts is 1, 6, 10, 12 workers: the published 2, 7, 10, 12 or one fewer, never
    more. A 5 % (or 13 GiB) margin would plan 8 on 256 GiB and 12 on 384 GiB, more than
    published; no linear rule with any margin fraction reproduces 2, 7, 10, 12 exactly, and with
    69 + 20 × W only fractions in (24.7 %, 26.2 %] give "published or one fewer" on all four."""

    safety_margin_fraction: float = 0.25
    safety_margin_min_gib: float = 4.0
    base_gib: float = 69.0
    """Idle RSS with the PoRep SRS (≈ 44 GiB) and PCE (≈ 26 GiB) resident: measured 69 GiB."""
    per_worker_gib: float = 20.0
    """Peak RSS added per partition worker (rule of thumb, workers release)."""
    max_workers: int = 12
    """More partition workers than this is no faster (memory bandwidth; docs/daemon.md, figures)."""
    warmup_workers: int = 2
    """Workers for the warmup proof, which builds the PCE cache (slow; keep it small)."""
    gpu_vram_need_gib: float = 12.0
    """VRAM a GPU needs to prove (≈ 12 GiB per GPU)."""
    budget_partition_gib: float = 14.0
    """What the budget release reserves per PoRep partition."""
    srs_gib: float = 44.0
    """PoRep 32G SRS resident, for ``total_budget``."""
    pce_gib: float = 26.0
    """PoRep PCE in memory, for ``total_budget``."""
    step_down_by: int = 1
    """Workers removed by each step down after an OOM kill or a critical memory event."""

    def __post_init__(self) -> None:
        counts = ("max_workers", "warmup_workers", "step_down_by")
        require_fields(self, [n for n in self.__dataclass_fields__ if n not in counts], FINITE)
        # A fraction of 1 would leave nothing to plan with, whatever the host.
        require_fields(self, ("safety_margin_fraction",), in_range(0, 1, high_open=True))
        require_fields(
            self,
            ("safety_margin_min_gib", "base_gib", "gpu_vram_need_gib", "srs_gib", "pce_gib"),
            NON_NEGATIVE,
        )
        # Zero per worker would make every host fit any number of workers.
        require_fields(self, ("per_worker_gib", "budget_partition_gib"), POSITIVE)
        require_fields(self, counts, int_at_least(1))

    def margin_bytes(self, bound_bytes: int) -> int:
        """The safety margin for a limit of ``bound_bytes`` (the lower of host and cgroup)."""
        share = math.ceil(bound_bytes * self.safety_margin_fraction)
        return max(share, gib_to_bytes(self.safety_margin_min_gib))


@dataclass(frozen=True)
class EffectiveLimit:
    """What a plan may use: ``min(host, cgroup) − margin`` (never below 0), and why."""

    limit_bytes: int
    host_bytes: int
    cgroup_bytes: int | None
    margin_bytes: int
    bound_by: str
    """``"host"`` or ``"cgroup"``: which of the two was lower (the host on a tie)."""

    @property
    def bound_bytes(self) -> int:
        """The hard limit where the kernel acts: the lower of host RAM and the cgroup limit."""
        return self.host_bytes if self.bound_by == "host" else int(self.cgroup_bytes or 0)

    @property
    def formula(self) -> str:
        cgroup = (
            "no cgroup" if self.cgroup_bytes is None else f"cgroup {fmt_gib(self.cgroup_bytes)}"
        )
        host = fmt_gib(self.host_bytes)
        return f"min(host {host}, {cgroup}) − margin {fmt_gib(self.margin_bytes)}"

    @property
    def reason(self) -> str:
        text = f"{self.formula} = {fmt_gib(self.limit_bytes)}"
        if self.limit_bytes == 0:
            return f"{text} (the margin is larger than the limit)"
        if self.cgroup_bytes is None:
            return f"{text}: no cgroup limit, the host's RAM binds"
        return f"{text}: the {self.bound_by} binds"

    def to_dict(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return values | {"bound_bytes": self.bound_bytes, "reason": self.reason}


def effective_limit(
    host_total_bytes: int, cgroup_limit_bytes: int | None, safety_margin_bytes: int
) -> EffectiveLimit:
    """``min(host, cgroup) − margin``, floored at 0, with which one bound it. A cgroup limit at or
    above the host's RAM (cgroup v1 reports "unlimited" as a huge number) does not bind; ``None``
    means no cgroup limit was found."""
    owner = "effective_limit"
    require_value(owner, "host_total_bytes", host_total_bytes, int_above(0))
    require_value(owner, "cgroup_limit_bytes", cgroup_limit_bytes, int_above(0).or_none())
    require_value(owner, "safety_margin_bytes", safety_margin_bytes, int_at_least(0))
    if cgroup_limit_bytes is not None and cgroup_limit_bytes < host_total_bytes:
        bound, bound_by = cgroup_limit_bytes, "cgroup"
    else:
        bound, bound_by = host_total_bytes, "host"
    return EffectiveLimit(
        limit_bytes=max(0, bound - safety_margin_bytes),
        host_bytes=host_total_bytes,
        cgroup_bytes=cgroup_limit_bytes,
        margin_bytes=safety_margin_bytes,
        bound_by=bound_by,
    )


def sim_memory_scale(mib_per_simulated_gib: float) -> float:
    """``PlanInputs.memory_scale`` for a simulator run with ``--memory-scale m``: it allocates ``m``
    real MiB per simulated GiB, so one real byte stands for ``1024 / m`` simulated bytes."""
    require_value(
        "sim_memory_scale", "mib_per_simulated_gib", mib_per_simulated_gib, number_above(0)
    )
    return GIB / (mib_per_simulated_gib * MIB)


_ALL_SIZES = Rule(lambda sizes: all(is_int(v) and v >= 0 for v in sizes), "integers >= 0")


@dataclass(frozen=True)
class PlanInputs:
    """What the plan is made from: measured memory and GPUs, and an optional operator override.
    ``memory_scale`` is planning bytes per measured byte: 1 on real hardware. Against the simulator
    use ``sim_memory_scale(m)``: the measured host and cgroup bytes are then planned as simulated
    bytes, so the figures (69 + 20 × W GiB) and the plan's ``total_budget_gib`` are in the simulated
    GiB the simulator reads from its config. VRAM is never scaled (the simulator allocates none)."""

    host_total_bytes: int
    cgroup_limit_bytes: int | None = None
    gpu_vram_total_bytes: tuple[int, ...] = ()
    """One entry per GPU: its total VRAM. Empty: no GPU seen (plan from RAM only)."""
    workers_override: int | None = None
    """The operator's worker count: replaces the computed one, with notes when it does not fit."""
    memory_scale: float = 1.0

    def __post_init__(self) -> None:
        # A list from a caller would make the frozen value unhashable; keep it a tuple.
        object.__setattr__(self, "gpu_vram_total_bytes", tuple(self.gpu_vram_total_bytes))
        require_fields(self, ("host_total_bytes",), int_above(0))
        require_fields(self, ("cgroup_limit_bytes",), int_above(0).or_none())
        require_fields(self, ("gpu_vram_total_bytes",), _ALL_SIZES)
        require_fields(self, ("workers_override",), int_at_least(1).or_none())
        require_fields(self, ("memory_scale",), number_above(0))

    def to_dict(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return values | {"gpu_vram_total_bytes": list(self.gpu_vram_total_bytes)}
