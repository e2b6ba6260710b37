"""Doctor's checks: each gathers its facts through ``Probes`` and hands them to its verdict;
``run_checks`` orders them (folders before the socket in them) and never lets one check's crash
hide the others."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import httpx

from cuzk_supervisor.adapters.proving.proofinput import load_c1
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.cli.doctor.judges import (
    DiskFacts,
    GpuFacts,
    ListenFacts,
    ManagerFacts,
    MemoryFacts,
    judge_binary,
    judge_c1,
    judge_disk,
    judge_folder,
    judge_gpus,
    judge_listens,
    judge_manager,
    judge_memory,
    judge_vram,
)
from cuzk_supervisor.cli.doctor.probes import (
    Probes,
    nearest_existing,
    os_error_text,
    param_cache_need,
    previous_state,
    probe_folder,
)
from cuzk_supervisor.cli.doctor.results import MANAGER_TIMEOUT_S, CheckResult, fail
from cuzk_supervisor.core.memory import MemoryPolicy, PlanInputs
from cuzk_supervisor.core.plan import plan_workers
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings, redact_url
from cuzk_supervisor.settings.policies import daemon_listen, policy


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
    scale = s.plan_memory_scale  # shown as planned: the plan's note names the scale
    facts = MemoryFacts(
        host_total=int(snap.host_total * scale),
        cgroup_limit=None if snap.cgroup_limit is None else int(snap.cgroup_limit * scale),
        cgroup_version=snap.cgroup_version,
        cgroup_dir=sampler.cgroup.dir if sampler.cgroup is not None else None,
    )
    memory_policy = policy(MemoryPolicy, s)
    inputs = PlanInputs(
        host_total_bytes=snap.host_total,
        cgroup_limit_bytes=snap.cgroup_limit,
        gpu_vram_total_bytes=tuple(d.total_bytes for d in gpus.devices),
        workers_override=s.workers or None,
        memory_scale=s.plan_memory_scale,
    )
    return judge_memory(facts, plan_workers(inputs, memory_policy), memory_policy)


def check_disk(s: Settings, probes: Probes) -> CheckResult:
    """Room for the parameters and PCE files: the figure the check before ``run`` refuses by."""
    cache = s.daemon_param_cache.absolute()
    checked = nearest_existing(cache)
    need = param_cache_need(s, previous_state(s))
    try:
        free: int | None = int(probes.disk_usage(checked).free)
        usage_error = None
    except OSError as exc:
        free, usage_error = None, os_error_text(exc)
    write_error = probe_folder(cache).error
    return judge_disk(DiskFacts(cache, checked, free, need, usage_error, write_error))


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
    off = None if s.health_enabled else "health server off (health_enabled=false)"
    facts = [
        _listen("daemon_listen", daemon_listen(s), probes),
        _listen("daemon_status_listen", s.daemon_status_listen, probes),
        _listen("health_listen", s.health_listen, probes, skipped=off),
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


def _guarded(name: str, check: Callable[[], CheckResult | list[CheckResult]]) -> list[CheckResult]:
    """An unexpected exception is that check's ``fail``, not the end of doctor."""
    try:
        out = check()
    except Exception as exc:
        return [fail(name, f"check crashed: {type(exc).__name__}: {exc}")]
    return out if isinstance(out, list) else [out]


def run_checks(s: Settings, probes: Probes | None = None) -> list[CheckResult]:
    probes = probes or Probes()
    try:
        gpus = gather_gpus(s, probes)
    except Exception as exc:
        gpus = GpuFacts(mode=s.gpu_probe, available=True, error=f"{type(exc).__name__}: {exc}")
    need_gib = policy(MemoryPolicy, s).gpu_vram_need_gib
    checks: list[tuple[str, Callable[[], CheckResult | list[CheckResult]]]] = [
        ("daemon_binary", lambda: check_binary(s, probes)),
        ("gpus", lambda: judge_gpus(gpus)),
        ("vram", lambda: judge_vram(gpus, need_gib)),
        ("memory", lambda: check_memory(s, probes, gpus)),
        ("disk", lambda: check_disk(s, probes)),
        ("state_dir", lambda: judge_folder("state_dir", probe_folder(s.state_dir))),
        ("run_dir", lambda: judge_folder("run_dir", probe_folder(s.run_dir))),
        ("log_dir", lambda: judge_folder("log_dir", probe_folder(s.log_dir))),
        ("listen", lambda: check_listens(s, probes)),
        ("manager", lambda: judge_manager(probe_manager(s, probes))),
        ("c1_file", lambda: check_c1(s)),
    ]
    results: list[CheckResult] = []
    for name, check in checks:
        results.extend(_guarded(name, check))
    return results
