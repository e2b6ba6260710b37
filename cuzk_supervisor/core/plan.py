"""The memory plan: how many partition workers fit in the effective memory limit, the daemon
config values that follow, and the step down after an OOM kill (incident I4).

Peak RSS follows the rule of thumb ``base + per_worker × W`` (69 + 20 × W GiB) against the
effective limit (:mod:`cuzk_supervisor.core.memory`). Every number carries the reason it has, so
the plan can be printed as a table, logged as JSON and sent with the bench rate (incident I6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict

from cuzk_supervisor.core.memory import EffectiveLimit, MemoryPolicy, PlanInputs, effective_limit
from cuzk_supervisor.core.units import GIB, MIB, fmt_gib, gib_to_bytes


class PlanConfigValues(TypedDict):
    """The daemon config values a plan decides (the rest of ``DaemonConfigValues`` is settings)."""

    partition_workers: int
    total_budget_gib: int
    max_parallel_synthesis: int


@dataclass(frozen=True)
class WorkerPlan:
    """How many partition workers, the daemon config values that follow, and why.
    ``partition_workers`` and ``max_parallel_synthesis`` are always ``full_workers`` (both releases
    obey the same number), so they are derived, not stored. ``reasons`` maps each number to the
    sentence that explains it; ``notes`` are warnings worth showing (a small GPU, an override that
    does not fit, a scaled plan); ``step_downs`` are the causes of each step down."""

    inputs: PlanInputs
    limit: EffectiveLimit
    rule: str
    full_workers: int
    warmup_workers: int
    total_budget_gib: int
    reasons: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    step_downs: tuple[str, ...] = ()

    @property
    def partition_workers(self) -> int:
        return self.full_workers

    @property
    def max_parallel_synthesis(self) -> int:
        return self.full_workers

    @property
    def gpu_count(self) -> int:
        return len(self.inputs.gpu_vram_total_bytes)

    @property
    def gpu_vram_total_bytes(self) -> tuple[int, ...]:
        return self.inputs.gpu_vram_total_bytes

    def reason(self, name: str) -> str:
        return dict(self.reasons)[name]

    def summary(self) -> str:
        """One line for a log: the numbers and the reason for the worker count."""
        return (
            f"{self.full_workers} partition workers (warmup {self.warmup_workers}), "
            f"total_budget {self.total_budget_gib}GiB, {self.gpu_count} GPU(s): "
            f"{self.reason('full_workers')}"
        )

    def config_values(self) -> PlanConfigValues:
        """The plan's part of ``DaemonConfigValues``: ``DaemonConfigValues(**plan.config_values(),
        listen=...)``. (Kept as a dict so this module imports nothing that does I/O.)"""
        return {
            "partition_workers": self.partition_workers,
            "total_budget_gib": self.total_budget_gib,
            "max_parallel_synthesis": self.max_parallel_synthesis,
        }

    def rows(self) -> tuple[tuple[str, str, str], ...]:
        """(name, value, reason) for a table, in the order a person reads them."""
        values: dict[str, object] = {
            "effective_limit": fmt_gib(self.limit.limit_bytes),
            "full_workers": self.full_workers,
            "warmup_workers": self.warmup_workers,
            "partition_workers": self.partition_workers,
            "total_budget": f"{self.total_budget_gib}GiB",
            "max_parallel_synthesis": self.max_parallel_synthesis,
            "gpus": self.gpu_count,
        }
        return tuple((name, str(values[name]), self.reason(name)) for name in values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "full_workers": self.full_workers,
            "warmup_workers": self.warmup_workers,
            **self.config_values(),
            "gpu_count": self.gpu_count,
            "gpu_vram_total_bytes": list(self.gpu_vram_total_bytes),
            "rule": self.rule,
            "limit": self.limit.to_dict(),
            "inputs": self.inputs.to_dict(),
            "reasons": dict(self.reasons),
            "notes": list(self.notes),
            "step_downs": list(self.step_downs),
        }


@dataclass(frozen=True)
class PlanRefusal:
    """No plan: less than one worker fits, or no GPU has enough VRAM. ``reasons`` says each."""

    inputs: PlanInputs
    limit: EffectiveLimit
    reasons: tuple[str, ...]
    shortfall_bytes: int | None = None
    """Memory missing for one worker; None when memory was not the problem."""

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "refused": True,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "shortfall_bytes": self.shortfall_bytes,
            "limit": self.limit.to_dict(),
            "inputs": self.inputs.to_dict(),
        }


@dataclass(frozen=True)
class GiveUpOOM:
    """Out of memory at one worker: nothing left to step down to. ``reason`` names the cause."""

    reason: str
    cause: str
    step_downs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "give_up": True,
            "reason": self.reason,
            "cause": self.cause,
            "step_downs": list(self.step_downs),
        }


_BUDGET_CUT_NOTE = "total_budget "


def _fits(limit: EffectiveLimit, policy: MemoryPolicy) -> int:
    """The most workers whose peak ``base + per_worker × W`` fits the limit (0 if none)."""
    spare = limit.limit_bytes - gib_to_bytes(policy.base_gib)
    return max(0, spare // gib_to_bytes(policy.per_worker_gib))


def memory_fit(limit: EffectiveLimit, policy: MemoryPolicy) -> int:
    """The most partition workers the memory allows by the rule, up to ``max_workers`` (what a
    projection of more workers may go to; issue 33)."""
    return min(_fits(limit, policy), policy.max_workers)


def total_budget_gib(workers: int, limit: EffectiveLimit, policy: MemoryPolicy) -> int:
    """The daemon's ``total_budget`` for ``workers`` (e.g. the warmup's, below the plan's)."""
    return _budget(workers, limit, policy)[0]


def _budget(workers: int, limit: EffectiveLimit, policy: MemoryPolicy) -> tuple[int, str, bool]:
    """``total_budget`` in whole GiB, its reason, and whether the limit cut it below the need."""
    need_gib = math.ceil(policy.srs_gib + policy.pce_gib + workers * policy.budget_partition_gib)
    cap_gib = limit.limit_bytes // GIB
    budget = max(1, min(need_gib, cap_gib))  # the daemon config needs >= 1
    formula = (
        f"SRS {policy.srs_gib:g} + PCE {policy.pce_gib:g} + {workers} × "
        f"{policy.budget_partition_gib:g} GiB per partition = {need_gib} GiB"
    )
    if budget >= need_gib:
        return budget, f"{formula} (budget release), within the effective limit", False
    return (
        budget,
        f"{formula}, cut to {budget} GiB so it never exceeds the effective limit "
        f"{fmt_gib(limit.limit_bytes)}: the budget release will run fewer partitions at once",
        True,
    )


def _build_plan(
    inputs: PlanInputs,
    limit: EffectiveLimit,
    rule: str,
    workers: int,
    workers_reason: str,
    policy: MemoryPolicy,
    notes: tuple[str, ...],
    step_downs: tuple[str, ...] = (),
) -> WorkerPlan:
    """A plan for ``workers`` with every derived number (and its reason) computed from it."""
    warmup = min(policy.warmup_workers, workers)
    budget, budget_reason, cut = _budget(workers, limit, policy)
    # The budget note describes this W only: drop one carried over from before a step down.
    notes = tuple(n for n in notes if not n.startswith(_BUDGET_CUT_NOTE))
    if cut:
        notes = (*notes, f"{_BUDGET_CUT_NOTE}{budget} GiB is below what {workers} partitions need")
    gpus = inputs.gpu_vram_total_bytes
    vram = ", ".join(fmt_gib(v) for v in gpus)
    gpus_why = f"{len(gpus)} GPU(s), VRAM {vram}" if gpus else "no GPU seen: planned from RAM only"
    reasons = (
        ("effective_limit", limit.reason),
        ("full_workers", workers_reason),
        (
            "warmup_workers",
            f"min(warmup {policy.warmup_workers}, full {workers}): the warmup proof builds the "
            "PCE cache and is slow; fewer workers keep its memory low",
        ),
        ("partition_workers", "= full workers: the workers release synthesizes this many at once"),
        ("total_budget", budget_reason),
        (
            "max_parallel_synthesis",
            "= full workers: caps the budget release at the same concurrency (its default is 18)",
        ),
        ("gpus", gpus_why),
    )
    return WorkerPlan(inputs, limit, rule, workers, warmup, budget, reasons, notes, step_downs)


def plan_workers(inputs: PlanInputs, policy: MemoryPolicy) -> WorkerPlan | PlanRefusal:
    """The worker plan for these inputs, or a refusal that says what is missing. ``full_workers`` is
    the largest W with ``base + per_worker × W ≤ effective limit``, clamped to ``[1, max_workers]``;
    less than one → ``PlanRefusal`` naming the shortfall in GiB. An override replaces W (notes say
    when it does not fit or exceeds the maximum). GPUs below the VRAM need are noted; if every GPU
    is below it, the plan is refused. No GPU at all (sim, doctor on a laptop) is noted."""
    scale = inputs.memory_scale
    host = max(1, int(inputs.host_total_bytes * scale))
    cgroup = inputs.cgroup_limit_bytes
    if cgroup is not None:
        cgroup = max(1, int(cgroup * scale))
    bound = host if cgroup is None else min(host, cgroup)
    limit = effective_limit(host, cgroup, policy.margin_bytes(bound))
    rule = (
        f"{policy.base_gib:g} + {policy.per_worker_gib:g} × W ≤ {fmt_gib(limit.limit_bytes)} "
        f"({limit.formula})"
    )
    notes: list[str] = []
    refusals: list[str] = []
    if scale != 1.0:
        notes.append(
            f"planned in scaled bytes: measured memory × {scale:g} (a simulator allocating "
            f"{GIB / scale / MIB:g} MiB per simulated GiB); sizes are simulated GiB"
        )

    need = gib_to_bytes(policy.gpu_vram_need_gib)
    gpus = inputs.gpu_vram_total_bytes
    small = [(i, v) for i, v in enumerate(gpus) if v < need]
    listing = ", ".join(f"GPU {i}: {fmt_gib(v)}" for i, v in small)
    if not gpus:
        notes.append(
            "no GPU seen: planned from RAM only (fine for sim or doctor; proving needs one)"
        )
    elif len(small) == len(gpus):
        refusals.append(
            f"no usable GPU: every GPU has less than the {policy.gpu_vram_need_gib:g} GiB VRAM a "
            f"proof needs ({listing})"
        )
    elif small:
        notes.append(
            f"below the {policy.gpu_vram_need_gib:g} GiB VRAM a proof needs, may fail proofs: "
            f"{listing}"
        )

    fit = _fits(limit, policy)
    one = gib_to_bytes(policy.base_gib + policy.per_worker_gib)
    shortfall = None
    if inputs.workers_override is not None:
        workers = inputs.workers_override
        workers_reason = f"override: {workers} (the rule fits {min(fit, policy.max_workers)})"
        if workers > fit:
            peak = gib_to_bytes(policy.base_gib + policy.per_worker_gib * workers)
            notes.append(
                f"override {workers} does not fit: peak by the rule {fmt_gib(peak)} > effective "
                f"limit {fmt_gib(limit.limit_bytes)}"
            )
        if workers > policy.max_workers:
            notes.append(f"override {workers} exceeds max {policy.max_workers}: more is slower")
    elif fit < 1:
        shortfall = one - limit.limit_bytes
        refusals.insert(
            0,
            f"needs {fmt_gib(one)} for 1 worker, effective limit {fmt_gib(limit.limit_bytes)}: "
            f"short by {fmt_gib(shortfall)} ({limit.formula})",
        )
        workers, workers_reason = 0, ""
    elif fit > policy.max_workers:
        workers = policy.max_workers
        workers_reason = (
            f"{fit} fit by {rule}; clamped to max {policy.max_workers}: more is slower "
            "(memory bandwidth)"
        )
    else:
        workers = fit
        workers_reason = f"largest W with {rule}"

    if refusals:
        return PlanRefusal(inputs, limit, tuple(refusals), shortfall)
    return _build_plan(inputs, limit, rule, workers, workers_reason, policy, tuple(notes))


def step_down(
    plan: WorkerPlan,
    cause: str,
    policy: MemoryPolicy,
    running_workers: int | None = None,
    fitted: int | None = None,
    fitted_reason: str = "",
) -> WorkerPlan | GiveUpOOM:
    """The plan after an OOM kill or a critical memory event: ``step_down_by`` fewer workers (at
    least 1), derived values recomputed, the cause recorded. At 1 worker: ``GiveUpOOM``. ``fitted``
    is what a measurement says fits (``core.memfit.fit_workers``): then the step goes there at once,
    not one worker at a time (never above ``current - step_down_by``). ``running_workers`` is what
    the daemon ran when memory ran out (the warmup runs fewer than the plan): stepping down from the
    plan's full count would only repeat the same OOM, so it steps from the lower of the two."""
    history = (*plan.step_downs, cause)
    current = plan.full_workers
    if running_workers is not None:
        current = max(1, min(current, running_workers))
    if current <= 1:
        why = f"out of memory at 1 partition worker, nothing left to step down to: {cause}"
        return GiveUpOOM(why, cause, history)
    workers = max(1, current - policy.step_down_by)
    reason = f"stepped down from {current} to {workers} after: {cause}"
    if fitted is not None and fitted < workers:
        workers = max(1, fitted)
        reason = f"stepped down from {current} to {workers} after: {cause}; {fitted_reason}"
    return _build_plan(
        plan.inputs, plan.limit, plan.rule, workers, reason, policy, plan.notes, history
    )
