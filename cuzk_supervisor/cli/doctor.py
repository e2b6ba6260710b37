"""Pre-run checks of a proving machine: ``cuzk-supervisor doctor``.

Each check answers one question a run would otherwise answer the hard way, minutes or hours in
(incidents I4 and I5: a plan that cannot fit, a disk that fills during the PCE build, a port
some other process holds). A check is a ``CheckResult(name, verdict, detail)``; the verdict is
``ok``, ``warn`` (the run can go on, but look) or ``fail`` (the run would not get through).

Layout, as in the rest of the supervisor: pure verdict functions first (``judge_*``: plain
facts in, a ``CheckResult`` out, no I/O), then the probes that gather those facts (all behind
``Probes``, so tests swap the GPU probe, the memory sampler, the disk-usage function, the
binary lookup, the port probe, the HTTP transport and the clock), then ``run_checks``, which
orders them and never lets one check's crash hide the others.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import httpx

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters import files
from cuzk_supervisor.adapters.gpu import GpuDevice, GpuFault, GpuProbe
from cuzk_supervisor.adapters.params import file_sizes, parse_expected
from cuzk_supervisor.adapters.proofinput import load_c1
from cuzk_supervisor.adapters.resources import MemorySampler
from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import PlanRefusal, WorkerPlan, plan_workers
from cuzk_supervisor.core.units import GIB
from cuzk_supervisor.daemon.process import _resolve_binary, address_in_use
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.lifecycle import assemble
from cuzk_supervisor.settings import Settings, redact_url

# --- figures ----------------------------------------------------------------------------------

PCE_FILES_BYTES = 25 * GIB
"""The budget release writes ~25 GiB of PCE files into ``[srs] param_cache`` on its first proof
(cuzk.md §2); the workers release keeps its PCE there too."""

PARAMS_BYTES = 100 * GIB
"""The 32 GiB-sector proof parameters (and their caches) are over 100 GiB on disk once fetched;
files that ``params_expected`` lists and that are already there at full size are subtracted."""

REQUIRED_FREE_BYTES = PCE_FILES_BYTES + PARAMS_BYTES
"""Free bytes the param cache's file system needs before a run on a fresh machine: the PCE
files plus the parameters. What is already present is subtracted (``disk_need``)."""

MANAGER_TIMEOUT_S = 5.0
"""Longest the manager check waits (connect and read each); the setting's connect timeout wins
when it is shorter. A doctor run should take seconds, not a manager's full retry budget."""

UNIX_PATH_MAX = 107
"""Longest unix socket path the kernel binds (``sun_path`` is 108 bytes with the NUL)."""

# --- results ----------------------------------------------------------------------------------


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    verdict: Verdict
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail}


def ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.OK, detail)


def warn(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.WARN, detail)


def fail(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.FAIL, detail)


def overall(results: Iterable[CheckResult]) -> Verdict:
    """The worst verdict (``ok`` for no checks at all)."""
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.WARN if Verdict.WARN in verdicts else Verdict.OK


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 when the machine can run the benchmark (``warn`` rows allowed), else 1 (FAILURE)."""
    return exitcodes.FAILURE if overall(results) is Verdict.FAIL else exitcodes.OK


def report(results: Sequence[CheckResult]) -> dict[str, Any]:
    """The JSON document ``doctor --json`` prints."""
    return {
        "overall": overall(results).value,
        "exit_code": exit_code(results),
        "checks": [r.to_dict() for r in results],
    }


# --- pure verdicts ----------------------------------------------------------------------------


def gib(n_bytes: float) -> str:
    """``"24 GiB"`` for (nearly) whole GiB, one decimal otherwise; MiB below 1 GiB."""
    if abs(n_bytes) < GIB:
        return f"{n_bytes / (1 << 20):.1f} MiB"
    value = n_bytes / GIB
    return f"{round(value)} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


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
    listing = ", ".join(f"GPU {d.index}: {gib(d.total_bytes)}" for d in facts.devices)
    small = [d for d in facts.devices if d.total_bytes < need]
    if len(small) == len(facts.devices):
        return fail(name, f"every GPU has less than the {need_gib:g} GiB a proof needs: {listing}")
    if small:
        low = ", ".join(f"GPU {d.index}: {gib(d.total_bytes)}" for d in small)
        return warn(name, f"below the {need_gib:g} GiB a proof needs, may fail proofs: {low}")
    busy = [d for d in facts.devices if d.free_bytes < need]
    if busy:
        held = ", ".join(
            f"GPU {d.index}: {gib(d.free_bytes)} free of {gib(d.total_bytes)}" for d in busy
        )
        return warn(name, f"less than {need_gib:g} GiB free (another process holds VRAM): {held}")
    return ok(name, f"{listing}; each ≥ the {need_gib:g} GiB a proof needs")


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    """The sampler's reading: host RAM and the cgroup limit (None: no limit found)."""

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
        cgroup = f"cgroup {gib(facts.cgroup_limit)} (v{facts.cgroup_version}{where})"
    seen = f"host {gib(facts.host_total)}, {cgroup}"
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
            f"{detail}: peak by the rule {gib(peak)} > effective limit "
            f"{gib(result.limit.limit_bytes)} (OOM risk){notes}",
        )
    return ok(name, detail + notes)


def disk_need(present_bytes: int) -> int:
    """Free bytes needed: ``REQUIRED_FREE_BYTES`` less the parameters already on disk (the PCE
    files are always written)."""
    return PCE_FILES_BYTES + max(0, PARAMS_BYTES - max(0, present_bytes))


@dataclass(frozen=True, slots=True)
class DiskFacts:
    cache: Path  # the daemon_param_cache setting
    checked: Path  # the cache, or its nearest existing parent
    free_bytes: int | None
    present_bytes: int  # parameter files of params_expected already there at full size
    usage_error: str | None = None
    write_error: str | None = None


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
    need = disk_need(facts.present_bytes)
    params_need = need - PCE_FILES_BYTES
    why = (
        f"PCE files {gib(PCE_FILES_BYTES)} + parameters {gib(params_need)}"
        f" ({gib(facts.present_bytes)} already present)"
        if facts.present_bytes
        else f"PCE files {gib(PCE_FILES_BYTES)} + parameters {gib(params_need)}"
    )
    if facts.free_bytes < need:
        return fail(
            name,
            f"only {gib(facts.free_bytes)} free at {where}, needs {gib(need)}: {why}",
        )
    return ok(name, f"{gib(facts.free_bytes)} free at {where}, writable; needs {gib(need)}: {why}")


def judge_folder(name: str, path: Path, created: bool, error: str | None) -> CheckResult:
    if error is not None:
        return fail(name, f"{path} is not writable: {error}")
    return ok(name, f"{path} writable" + (" (created)" if created else ""))


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
    sector = f", sector size {gib(sector_size)}" if sector_size else ""
    return ok(name, f"{path}: {size / 1e6:.1f} MB, readable and well-formed{sector}")


# --- probes (I/O) -----------------------------------------------------------------------------


class DiskUsage(Protocol):
    @property
    def free(self) -> int: ...


def os_error_text(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({exc.filename})" if exc.filename and exc.strerror else text


def nearest_existing(path: Path) -> Path:
    """``path`` if it exists, else its closest existing ancestor."""
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or "/")


def try_write(folder: Path) -> None:
    """Create and delete a temp file in ``folder``; raises OSError when that is not possible."""
    fd, name = tempfile.mkstemp(prefix=".cuzk-doctor-", dir=folder)
    os.close(fd)
    os.unlink(name)


def probe_folder(path: Path, create: bool = True) -> tuple[bool, str | None]:
    """(created, error): make ``path`` if missing (and ``create``), then try writing there."""
    created = False
    try:
        if create and not path.is_dir():
            files.make_folder(path)  # 0750 whatever the umask, as the supervisor makes it
            created = True
        try_write(path)
    except OSError as exc:
        return created, os_error_text(exc)
    return created, None


def listen_problem(address: Address) -> str | None:
    """Why the daemon (or our health server) could not listen at ``address``; None: it can."""
    if address.path is not None:
        if len(os.fsencode(address.path)) > UNIX_PATH_MAX:
            return (
                f"socket path is {len(os.fsencode(address.path))} bytes, more than the "
                f"{UNIX_PATH_MAX} the kernel binds"
            )
        if address_in_use(address):
            return "in use: a process answers on that socket"
        folder = nearest_existing(address.path.parent)
        try:
            try_write(folder)
        except OSError as exc:
            return f"socket folder {folder} is not writable: {os_error_text(exc)}"
        return None
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use by another process"
            return f"cannot bind: {os_error_text(exc)}"
    return None


@dataclass(frozen=True)
class Probes:
    """The machine's edges; tests replace any of them."""

    gpu_probe: Callable[[Settings], GpuProbe] = assemble.gpu_probe
    memory_sampler: Callable[[Settings], MemorySampler] = assemble.memory_sampler
    disk_usage: Callable[[Path], DiskUsage] = shutil.disk_usage
    resolve_binary: Callable[[str], tuple[str | None, str]] = _resolve_binary
    listen_problem: Callable[[Address], str | None] = listen_problem
    http_transport: httpx.BaseTransport | None = None
    clock: Callable[[], float] = field(default=time.monotonic)


def gather_gpus(s: Settings, probes: Probes) -> GpuFacts:
    if s.gpu_probe == "none":
        return GpuFacts(mode="none")
    probe = probes.gpu_probe(s)
    try:
        if not probe.available:
            return GpuFacts(mode=s.gpu_probe, available=False, reason=probe.reason)
        sample = probe.sample()
    finally:
        probe.shutdown()
    source = f"http://{s.daemon_status_listen}/status" if s.gpu_probe == "sim" else ""
    return GpuFacts(
        mode=s.gpu_probe,
        available=True,
        devices=tuple(sample.devices),
        faults=tuple(sample.faults),
        error=sample.error,
        source=source,
    )


def check_memory(s: Settings, probes: Probes, gpus: GpuFacts) -> CheckResult:
    sampler = probes.memory_sampler(s)
    snap = sampler.sample()
    facts = MemoryFacts(
        host_total=snap.host_total,
        cgroup_limit=snap.cgroup_limit,
        cgroup_version=snap.cgroup_version,
        cgroup_dir=sampler.cgroup.dir if sampler.cgroup is not None else None,
    )
    policy = assemble.memory_policy(s)
    inputs = PlanInputs(
        host_total_bytes=snap.host_total,
        cgroup_limit_bytes=snap.cgroup_limit,
        gpu_vram_total_bytes=tuple(d.total_bytes for d in gpus.devices),
        workers_override=s.workers or None,
        memory_scale=s.plan_memory_scale,
    )
    return judge_memory(facts, plan_workers(inputs, policy), policy)


def check_disk(s: Settings, probes: Probes) -> CheckResult:
    cache = s.daemon_param_cache.absolute()
    checked = nearest_existing(cache)
    expected = parse_expected(s.params_expected)
    present = 0
    if checked == cache and expected:
        sizes = file_sizes(cache, expected)
        present = sum(f.size for f in expected if sizes.get(f.name) == f.size)
    try:
        free: int | None = int(probes.disk_usage(checked).free)
        usage_error = None
    except OSError as exc:
        free, usage_error = None, os_error_text(exc)
    write_error = None
    try:
        try_write(checked)
    except OSError as exc:
        write_error = os_error_text(exc)
    return judge_disk(DiskFacts(cache, checked, free, present, usage_error, write_error))


def check_folder(name: str, path: Path) -> CheckResult:
    created, error = probe_folder(path)
    return judge_folder(name, path, created, error)


def check_binary(s: Settings, probes: Probes) -> CheckResult:
    resolved, reason = probes.resolve_binary(s.daemon_binary)
    return judge_binary(s.daemon_binary, resolved, reason)


def _listen(name: str, text: str, probes: Probes, skipped: str | None = None) -> ListenFacts:
    if skipped is not None:
        return ListenFacts(name, text, None, skipped=skipped)
    try:
        address = parse_address(text)
    except UsageError as exc:
        return ListenFacts(name, text, None, problem=f"setting {name}: {exc}")
    return ListenFacts(name, text, address, problem=probes.listen_problem(address))


def check_listens(s: Settings, probes: Probes) -> list[CheckResult]:
    facts = [
        _listen("daemon_listen", assemble.daemon_listen(s), probes),
        _listen("daemon_status_listen", s.daemon_status_listen, probes),
        _listen(
            "health_listen",
            s.health_listen,
            probes,
            skipped=None if s.health_enabled else "health server off (health_enabled=false)",
        ),
    ]
    return judge_listens(facts)


def probe_manager(s: Settings, probes: Probes) -> ManagerFacts | None:
    if not s.manager_url:
        return None
    url = s.manager_url.rstrip("/") + "/status"
    shown = redact_url(url)
    headers = {"Authorization": f"Bearer {s.manager_token}"} if s.manager_token else {}
    timeout = httpx.Timeout(
        MANAGER_TIMEOUT_S, connect=min(s.manager_connect_timeout_s, MANAGER_TIMEOUT_S)
    )
    start = probes.clock()
    try:
        with httpx.Client(transport=probes.http_transport, timeout=timeout) as client:
            response = client.get(url, headers=headers)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        text = str(exc) or "no detail"
        return ManagerFacts(
            shown, error=f"{type(exc).__name__}: {text}", elapsed_s=probes.clock() - start
        )
    elapsed = probes.clock() - start
    instances = None
    with contextlib.suppress(ValueError):
        document = response.json()
        if isinstance(document, list):
            instances = len(document)
    return ManagerFacts(
        shown, response.status_code, None, elapsed, instances, response.text.strip()
    )


def check_c1(s: Settings) -> CheckResult:
    try:
        c1 = load_c1(s.c1_file)
    except UsageError as exc:
        return judge_c1(s.c1_file, None, None, str(exc))
    return judge_c1(s.c1_file, c1.size_bytes, c1.sector_size, None)


# --- the whole ---------------------------------------------------------------------------------


def _guarded(name: str, check: Callable[[], CheckResult | list[CheckResult]]) -> list[CheckResult]:
    """Run one check; an unexpected exception is that check's ``fail``, not the end of doctor."""
    try:
        out = check()
    except Exception as exc:
        return [fail(name, f"check crashed: {type(exc).__name__}: {exc}")]
    return out if isinstance(out, list) else [out]


def run_checks(s: Settings, probes: Probes | None = None) -> list[CheckResult]:
    """Every check, in the order a person fixes things (folders before the socket in them)."""
    probes = probes or Probes()
    try:
        gpus = gather_gpus(s, probes)
    except Exception as exc:
        gpus = GpuFacts(mode=s.gpu_probe, available=True, error=f"{type(exc).__name__}: {exc}")
    need_gib = assemble.memory_policy(s).gpu_vram_need_gib
    checks: list[tuple[str, Callable[[], CheckResult | list[CheckResult]]]] = [
        ("daemon_binary", lambda: check_binary(s, probes)),
        ("gpus", lambda: judge_gpus(gpus)),
        ("vram", lambda: judge_vram(gpus, need_gib)),
        ("memory", lambda: check_memory(s, probes, gpus)),
        ("disk", lambda: check_disk(s, probes)),
        ("state_dir", lambda: check_folder("state_dir", s.state_dir)),
        ("run_dir", lambda: check_folder("run_dir", s.run_dir)),
        ("log_dir", lambda: check_folder("log_dir", s.log_dir)),
        ("listen", lambda: check_listens(s, probes)),
        ("manager", lambda: judge_manager(probe_manager(s, probes))),
        ("c1_file", lambda: check_c1(s)),
    ]
    results: list[CheckResult] = []
    for name, check in checks:
        results.extend(_guarded(name, check))
    return results
