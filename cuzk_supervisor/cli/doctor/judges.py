"""Doctor's pure verdicts: plain facts in, a ``CheckResult`` out, no I/O (``judge_*``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.adapters.machine.gpu import GpuDevice, GpuFault
from cuzk_supervisor.address import Address
from cuzk_supervisor.cli.doctor.results import CheckResult, fail, ok, warn
from cuzk_supervisor.core.disk import DiskNeed
from cuzk_supervisor.core.memory import MemoryPolicy
from cuzk_supervisor.core.plan import PlanRefusal, WorkerPlan
from cuzk_supervisor.core.units import GIB, fmt_bytes


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the configured GPU probe said. ``mode`` is the ``gpu_probe`` setting."""

    mode: str
    available: bool = False
    reason: str = ""  # why the probe is unavailable
    devices: tuple[GpuDevice, ...] = ()
    faults: tuple[GpuFault, ...] = ()
    error: str | None = None  # the probe answered nothing this time (sim: /status unreachable)
    source: str = ""  # where the probe reads (the sim's status URL)


def _names(devices: Sequence[GpuDevice]) -> str:
    counts = Counter(d.name or "unnamed GPU" for d in devices)
    return ", ".join(f"{n} × {name}" for name, n in counts.items())


def judge_gpus(facts: GpuFacts) -> CheckResult:
    name = "gpus"
    if facts.mode == "none":
        return warn(name, "not checked: gpu_probe=none (a proving machine needs gpu_probe=nvml)")
    if not facts.available:
        if facts.mode == "nvml":
            return fail(
                name,
                f"NVML unavailable: {facts.reason or 'unknown error'} (gpu_probe=nvml: a proving "
                "machine needs the NVIDIA driver and libnvidia-ml; gpu_probe=none or sim runs "
                "without GPUs)",
            )
        return fail(name, f"{facts.mode} probe unavailable: {facts.reason or 'unknown error'}")
    if facts.error is not None:
        if facts.mode == "sim":
            return warn(
                name,
                f"gpu_probe=sim: the simulated daemon's status {facts.source} did not answer "
                f"({facts.error}); its GPUs are seen once it runs",
            )
        return fail(name, f"{facts.mode} probe failed: {facts.error}")
    faults = "; ".join(f"GPU {f.index}: {f.error}" for f in facts.faults)
    if not facts.devices:
        if faults:
            return fail(name, f"no GPU answers: {faults}")
        return fail(name, f"{facts.mode} probe works but sees no GPU")
    seen = f"{len(facts.devices)} GPU(s): {_names(facts.devices)}"
    if faults:
        return warn(name, f"{seen}; not answering: {faults}")
    return ok(name, seen)


def judge_vram(facts: GpuFacts, need_gib: float) -> CheckResult:
    """Every GPU needs ``need_gib`` of VRAM (``MemoryPolicy.gpu_vram_need_gib``, ≈ 12 GiB)."""
    name = "vram"
    if facts.mode == "none":
        return warn(name, "not checked: gpu_probe=none")
    if not facts.devices:
        return warn(name, "not checked: no GPU seen (see gpus)")
    need = need_gib * GIB
    listing = ", ".join(f"GPU {d.index}: {fmt_bytes(d.total_bytes)}" for d in facts.devices)
    small = [d for d in facts.devices if d.total_bytes < need]
    if len(small) == len(facts.devices):
        return fail(name, f"every GPU has less than the {need_gib:g} GiB a proof needs: {listing}")
    if small:
        low = ", ".join(f"GPU {d.index}: {fmt_bytes(d.total_bytes)}" for d in small)
        return warn(name, f"below the {need_gib:g} GiB a proof needs, may fail proofs: {low}")
    busy = [d for d in facts.devices if d.free_bytes < need]
    if busy:
        held = ", ".join(
            f"GPU {d.index}: {fmt_bytes(d.free_bytes)} free of {fmt_bytes(d.total_bytes)}"
            for d in busy
        )
        return warn(name, f"less than {need_gib:g} GiB free (another process holds VRAM): {held}")
    return ok(name, f"{listing}; each ≥ the {need_gib:g} GiB a proof needs")


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    """The sampler's reading: host RAM and the cgroup limit (None: no limit found), in the bytes
    the plan reads (``plan_memory_scale`` applied: the simulator's figures are simulated GiB)."""

    host_total: int
    cgroup_limit: int | None
    cgroup_version: int | None = None
    cgroup_dir: Path | None = None


def judge_memory(
    facts: MemoryFacts, result: WorkerPlan | PlanRefusal, policy: MemoryPolicy
) -> CheckResult:
    """The plan ``plan_workers`` makes from the facts: refused is ``fail`` with its reason."""
    name = "memory"
    if facts.cgroup_limit is None:
        cgroup = "no cgroup limit"
    else:
        where = f" at {facts.cgroup_dir}" if facts.cgroup_dir is not None else ""
        cgroup = f"cgroup {fmt_bytes(facts.cgroup_limit)} (v{facts.cgroup_version}{where})"
    seen = f"host {fmt_bytes(facts.host_total)}, {cgroup}"
    if isinstance(result, PlanRefusal):
        return fail(name, f"{seen}: plan refused: {result.reason}")
    detail = (
        f"{seen}: {result.full_workers} workers (warmup {result.warmup_workers}), "
        f"total_budget {result.total_budget_gib} GiB"
    )
    notes = "".join(f"; note: {note}" for note in result.notes)
    peak = (policy.base_gib + policy.per_worker_gib * result.full_workers) * GIB
    if peak > result.limit.limit_bytes:
        return warn(
            name,
            f"{detail}: peak by the rule {fmt_bytes(peak)} > effective limit "
            f"{fmt_bytes(result.limit.limit_bytes)} (OOM risk){notes}",
        )
    return ok(name, detail + notes)


@dataclass(frozen=True, slots=True)
class DiskFacts:
    cache: Path  # the daemon_param_cache setting
    checked: Path  # the cache, or its nearest existing parent
    free_bytes: int | None
    need: DiskNeed  # what is still to be written there (``core.disk.disk_need``)
    usage_error: str | None = None
    write_error: str | None = None


def disk_need_words(need: DiskNeed) -> str:
    """``needs 125 GiB: PCE files 25 GiB + parameters 100 GiB``, with what the cache or an earlier
    run already holds, and the scale when the sizes are the simulator's."""
    notes: list[str] = []
    if need.present_bytes and not need.params_verified:
        notes.append(f"{fmt_bytes(need.present_bytes)} already present")
    if need.params_verified:
        notes.append("parameters verified by an earlier run")
    if need.pce_built:
        notes.append("PCE files built by an earlier run")
    if need.scale != 1:
        notes.append(f"simulated sizes: the real ones / {need.scale:g} (plan_memory_scale)")
    noted = f" ({'; '.join(notes)})" if notes else ""
    if not need.total_bytes:
        return f"needs nothing more{noted}"
    parts = f"PCE files {fmt_bytes(need.pce_bytes)} + parameters {fmt_bytes(need.params_bytes)}"
    return f"needs {fmt_bytes(need.total_bytes)}: {parts}{noted}"


def judge_disk(facts: DiskFacts) -> CheckResult:
    name = "disk"
    where = str(facts.checked)
    if facts.checked != facts.cache:
        where = f"{facts.checked} (nearest existing parent of {facts.cache})"
    if facts.usage_error is not None or facts.free_bytes is None:
        return fail(name, f"cannot read free space at {where}: {facts.usage_error}")
    if facts.write_error is not None:
        return fail(
            name,
            f"{where} is not writable: {facts.write_error} (parameters and PCE files go there)",
        )
    needs = disk_need_words(facts.need)
    if facts.free_bytes < facts.need.total_bytes:
        return fail(name, f"only {fmt_bytes(facts.free_bytes)} free at {where}, {needs}")
    return ok(name, f"{fmt_bytes(facts.free_bytes)} free at {where}, writable; {needs}")


@dataclass(frozen=True, slots=True)
class FolderFacts:
    """A folder the run writes to: there already, or to be made below ``checked``."""

    path: Path
    exists: bool
    checked: Path  # the folder itself, or its nearest existing parent
    error: str | None = None  # why it cannot be written (or made)


def judge_folder(name: str, facts: FolderFacts) -> CheckResult:
    if facts.exists:
        if facts.error is not None:
            return fail(name, f"{facts.path} is not writable: {facts.error}")
        return ok(name, f"{facts.path} writable")
    if facts.error is not None:
        return fail(name, f"{facts.path} cannot be created: {facts.error}")
    return ok(name, f"{facts.path} will be created (in {facts.checked}, writable)")


def judge_binary(setting: str, resolved: str | None, reason: str) -> CheckResult:
    name = "daemon_binary"
    if resolved is None:
        return fail(name, reason or f"daemon binary {setting!r} cannot be run")
    shown = resolved if resolved == setting else f"{setting} → {resolved}"
    return ok(name, f"{shown} (executable)")


@dataclass(frozen=True, slots=True)
class ListenFacts:
    """One address something must listen on; ``address`` is None when it does not parse."""

    name: str
    text: str
    address: Address | None
    problem: str | None = None  # from the probe: in use, cannot bind, folder not writable
    skipped: str | None = None  # why it is not checked (health server off)


def _overlaps(a: Address, b: Address) -> bool:
    if a.path is not None or b.path is not None:
        return a.path == b.path
    wildcard = {"0.0.0.0", "::"}
    return a.port == b.port and (a.host == b.host or a.host in wildcard or b.host in wildcard)


def judge_listens(listens: Sequence[ListenFacts]) -> list[CheckResult]:
    """One row per address: free (``ok``), unusable or shared with another of ours (``fail``)."""
    rows: list[CheckResult] = []
    for i, facts in enumerate(listens):
        if facts.skipped is not None:
            rows.append(ok(facts.name, f"not checked: {facts.skipped}"))
            continue
        if facts.address is None:
            rows.append(fail(facts.name, facts.problem or f"bad address {facts.text!r}"))
            continue
        shared = [
            other.name
            for other in listens[:i]
            if other.address is not None
            and other.skipped is None
            and _overlaps(facts.address, other.address)
        ]
        if shared:
            rows.append(fail(facts.name, f"{facts.address} is also {', '.join(shared)}"))
        elif facts.problem is not None:
            rows.append(fail(facts.name, f"{facts.address}: {facts.problem}"))
        elif facts.address.is_unix:
            rows.append(ok(facts.name, f"{facts.address}: free, folder writable"))
        else:
            rows.append(ok(facts.name, f"{facts.address}: free"))
    return rows


@dataclass(frozen=True, slots=True)
class ManagerFacts:
    url: str  # shown (redacted) /status URL
    status: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    instances: int | None = None  # entries in the /status list; None: not a list
    body: str = ""


def judge_manager(facts: ManagerFacts | None) -> CheckResult:
    name = "manager"
    if facts is None:
        return warn(name, "manager_url not set: local run, reports are only logged")
    took = f"{facts.elapsed_s * 1000:.0f} ms"
    if facts.error is not None:
        return fail(name, f"GET {facts.url} failed after {took}: {facts.error}")
    if facts.status is None or facts.status >= 400:
        return fail(name, f"GET {facts.url} answered {facts.status}: {facts.body[:200]}")
    if facts.instances is None:
        return warn(
            name,
            f"GET {facts.url} answered {facts.status} in {took}, but not the manager's /status "
            "(expected a JSON list)",
        )
    return ok(name, f"GET {facts.url}: {facts.status} in {took} ({facts.instances} instances)")


def judge_c1(
    path: Path, size: int | None, sector_size: int | None, error: str | None
) -> CheckResult:
    name = "c1_file"
    if error is not None or size is None:
        return fail(name, error or f"cannot read C1 file {path}")
    sector = f", sector size {fmt_bytes(sector_size)}" if sector_size else ""
    return ok(name, f"{path}: {size / 1e6:.1f} MB, readable and well-formed{sector}")
