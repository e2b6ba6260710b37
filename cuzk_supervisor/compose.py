"""The composition root: the one module that turns settings into the running object graph.

``run`` and ``sim`` run what it builds; ``doctor`` (and ``plan``, ``daemon``) measure the
machine with its probes. Read top to bottom, it is how one run is put together:

1. **the machine** (``Machine``): what memory and GPUs are measured with: the host's own (``HOST``:
   the memory sampler, NVML or the simulated daemon's ``/status``) unless the caller hands the
   simulator's in (``sim.machine.probes.machine``: the ``sim`` command, and ``cli.simhandoff``
   when the daemon of ``run``, ``doctor``, ``plan`` or ``daemon`` is the simulated one); nothing
   here, nor in what this builds, imports the simulator;
2. **the policies**: each value made from the settings where its mapping is declared once
   (``settings.policies``), never copied field by field;
3. **the edges** (``composeedges``: ``open_edges``): the instance's label and minimum rate, the
   manager client and the log shipper, made before logging is configured (the shipper is a log
   processor), and the reporter over them (``build_reporter``, in the lifecycle);
4. **the lifecycle** (``build_lifecycle``): the phase machine given its collaborators (daemon
   control, proof attempts, the step-down, reporting, monitors), sharing one ``Progress`` and one
   ``Signals``; tests of the phase machine build it with fakes (``tests/test_phase_machine.py``);
5. **the servers** (``run``): the state file and the outbox opened, the health server and the
   metrics when the health server is on, then the lifecycle run.

What would load gRPC, protobuf, the manager's HTTP client or the metrics is imported where it is
built, not at the top: ``prestart``, ``plan`` and ``doctor`` import this module and never prove.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuzk_supervisor.adapters.machine.gpu import GpuProbe, StaticProbe, no_gpu_activity
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.composeedges import (
    MANAGER_DEFAULT_MIN_RATE,
    Edges,
    bench_min_rate,
    build_reporter,
)
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import daemon_listen, keeper_recipe, policy

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth
    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.timeouts import ProvingTimeouts
    from cuzk_supervisor.adapters.state.store import StateKeeper
    from cuzk_supervisor.address import Address
    from cuzk_supervisor.lifecycle.daemonctl import DaemonControl
    from cuzk_supervisor.lifecycle.healthwatch import HealthWatch
    from cuzk_supervisor.lifecycle.machine import Lifecycle
    from cuzk_supervisor.runtime import Runtime
    from cuzk_supervisor.serve.metricsink import MetricsSink


# --- 1. the machine -----------------------------------------------------------------------------


def host_memory_sampler(s: Settings) -> MemorySampler:
    """The machine's own memory: the cgroup found (or ``cgroup_root``), ``/proc`` for the host."""
    if s.cgroup_root is not None:
        # An explicit cgroup folder (tests, or a runtime that hides the real one).
        from cuzk_supervisor.adapters.machine.cgroupfind import CgroupLocation, CgroupVersion

        version: CgroupVersion = 2 if (s.cgroup_root / "memory.max").exists() else 1
        location = CgroupLocation(version, s.cgroup_root, s.cgroup_root)
        return MemorySampler(proc_root=s.proc_root, cgroup=location, discover=False)
    return MemorySampler(proc_root=s.proc_root)


def host_gpu_probe(s: Settings) -> GpuProbe:
    """The probe ``gpu_probe`` names: NVML, the daemon's ``/status`` (``sim``), or none."""
    if s.gpu_probe == "nvml":
        from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe

        return NvmlProbe()
    if s.gpu_probe == "sim":
        from cuzk_supervisor.adapters.machine.gpusimstatus import SimStatusProbe

        return SimStatusProbe(f"http://{s.daemon_status_listen}/status")
    return StaticProbe(())


def host_gpu_health(s: Settings) -> NvmlHealth | None:
    """The run phase's NVML reads (XIDs, ECC, clocks): the host's NVML where ``gpu_probe`` is
    nvml, else none (the health watch then judges from the daemon alone)."""
    if s.gpu_probe != "nvml" or s.health_interval_s <= 0:
        return None
    from cuzk_supervisor.adapters.machine.nvmlevents import NvmlHealth

    return NvmlHealth()


@dataclass(frozen=True)
class Machine:
    """What the supervisor measures the machine with, and what it refuses about it before
    anything starts (``check``: ``UsageError``, exit 2). Each is read from the settings when
    asked, not before, so a refusal comes in the order ``cli.prestart`` checks things."""

    gpu_probe: Callable[[Settings], GpuProbe] = host_gpu_probe
    memory_sampler: Callable[[Settings], MemorySampler] = host_memory_sampler
    check: Callable[[Settings], None] = lambda s: None
    gpu_health: Callable[[Settings], NvmlHealth | None] = host_gpu_health


HOST = Machine()
"""The host's own probes: what every command measures unless a simulated machine is handed in."""


# --- 2. the policies (``settings.policies``) and 3. the edges (``composeedges``) ------------


# --- 4. the lifecycle ---------------------------------------------------------------------------


def build_lifecycle(
    s: Settings,
    runtime: Runtime,
    edges: Edges,
    *,
    state: StateKeeper,
    sampler: MemorySampler,
    gpu: GpuProbe,
    metrics: MetricsSink,
    gpu_health: NvmlHealth | None = None,
) -> Lifecycle:
    from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe
    from cuzk_supervisor.adapters.machine.heap import release_free_memory
    from cuzk_supervisor.adapters.proving.daemonstatus import synthesizing_now
    from cuzk_supervisor.adapters.proving.statussampler import StatusSampler
    from cuzk_supervisor.adapters.proving.timeouts import ProvingTimeouts
    from cuzk_supervisor.address import parse_address
    from cuzk_supervisor.core.bench import BenchPolicy
    from cuzk_supervisor.core.memory import MemoryPolicy
    from cuzk_supervisor.core.risk import RiskPolicy
    from cuzk_supervisor.lifecycle.daemonctl import DaemonControl
    from cuzk_supervisor.lifecycle.machine import Lifecycle
    from cuzk_supervisor.lifecycle.machineio import ParamsFetch, PlanResources
    from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
    from cuzk_supervisor.lifecycle.monitors import Monitors
    from cuzk_supervisor.lifecycle.proofs import ProofRunner
    from cuzk_supervisor.lifecycle.retries import LifecycleRetries
    from cuzk_supervisor.lifecycle.shared import Progress, Signals
    from cuzk_supervisor.lifecycle.stepdown import StepDown
    from cuzk_supervisor.lifecycle.values import FetchSettings, MonitorSettings, PhaseSettings

    shipper = edges.shipper
    meters: list[Callable[[], float | None]] = []

    def cpu_meter() -> float | None:
        """The container's CPU meter, made at the first sample (psutil, the cgroup files)."""
        if not meters:
            from cuzk_supervisor.adapters.machine.cpumeter import meter_for

            meters.append(meter_for(s.cgroup_root, s.proc_root))
        return meters[0]()

    retries = LifecycleRetries()
    spawn = runtime.reaper.spawn
    progress, signals = Progress(), Signals()
    memory_policy = policy(MemoryPolicy, s)
    # The watch samples the daemon's process tree: the pid is the daemon control's, read late.
    watch = MemoryWatch(sampler, policy(RiskPolicy, s), lambda: daemon.pid())
    watch.add_listener(lambda a: metrics.memory(a.headroom_bytes, a.level))
    watch.add_listener(lambda _: daemon.note_memory(watch.last))  # one walk of the tree, not two
    daemon = DaemonControl(
        keeper_recipe(s, sampler.cgroup.dir if sampler.cgroup else None), spawn=spawn,
        watch=watch, metrics=metrics, shipper=shipper, signals=signals, progress=progress,
        memory_policy=memory_policy,
    )  # fmt: skip
    reporter = build_reporter(
        s, edges, state=state, signals=signals, progress=progress, retries=retries,
        metrics=metrics,
    )  # fmt: skip
    address, timeouts = parse_address(daemon_listen(s)), policy(ProvingTimeouts, s)
    client_factory = proving_client(address, timeouts, on_reconnect=metrics.grpc_reconnect)
    proofs = ProofRunner(
        daemon=daemon, client_factory=client_factory, c1_file=s.c1_file, signals=signals,
        progress=progress, metrics=metrics, shipper=shipper, retry=retries.proof,
        proof_budget_s=s.proof_budget_s, rate_time_scale=s.rate_time_scale,
        status_sampler=StatusSampler(
            s.daemon_status_listen, s.bench_status_sample_s,
            cpu=lambda: cpu_meter(),
            gpus=gpu.activity if isinstance(gpu, NvmlProbe) else no_gpu_activity,
        ),
    )  # fmt: skip
    stepdown = StepDown(
        daemon=daemon, watch=watch, signals=signals, progress=progress, memory_policy=memory_policy,
        active_partitions=lambda: synthesizing_now(s.daemon_status_listen),
    )  # fmt: skip
    monitors = Monitors(
        policy(MonitorSettings, s), progress=progress, signals=signals, watch=watch, gpu=gpu,
        metrics=metrics, daemon=daemon, manager=reporter,
    )  # fmt: skip
    health = build_health_watch(
        s, daemon=daemon, manager=reporter, shipper=shipper, metrics=metrics, progress=progress,
        signals=signals, gpus=gpu_health, totals_client=proving_client(address, timeouts),
        min_rate=edges.min_rate,
    )  # fmt: skip
    return Lifecycle(
        config=policy(PhaseSettings, s), state=state, shipper=shipper, metrics=metrics,
        memory_policy=memory_policy,
        bench_policy=policy(BenchPolicy, s, min_rate=bench_min_rate(s, edges.min_rate),
                            min_soak_s=s.bench_min_soak_s / s.rate_time_scale),
        progress=progress, signals=signals, resources=PlanResources(sampler, gpu),
        fetch_params=ParamsFetch(policy(FetchSettings, s), spawn, shipper), daemon=daemon,
        proofs=proofs, stepdown=stepdown, reporter=reporter, monitors=monitors, health=health,
        release_memory=release_free_memory,
    )  # fmt: skip


def proving_client(
    address: Address, timeouts: ProvingTimeouts, **options: Any
) -> Callable[[], ProvingClient]:
    """A factory of the daemon's gRPC client, which imports gRPC at its first call: the daemon's
    first start, while it starts, not before the lifecycle's first phase (about 0.1 s of the
    supervisor's own start)."""

    def make() -> ProvingClient:
        from cuzk_supervisor.adapters.proving.client import ProvingClient

        return ProvingClient(address, timeouts, **options)

    return make


def build_health_watch(
    s: Settings,
    *,
    gpus: NvmlHealth | None,
    totals_client: Callable[[], Any],
    min_rate: float,
    daemon: DaemonControl,
    **collaborators: Any,
) -> HealthWatch:
    """The run phase's health watch: the daemon's status and GetMetrics, NVML, the policy and
    the ladder from the settings; ``min_rate`` as the manager holds it (0: its default)."""
    from cuzk_supervisor.adapters.proving.daemonstatus import fetch_status, status_address
    from cuzk_supervisor.core.healthladder import LadderPolicy
    from cuzk_supervisor.core.healthpolicy import HealthPolicy
    from cuzk_supervisor.lifecycle.healthwatch import HealthWatch, metrics_reader

    address = status_address(s.daemon_status_listen)

    async def read_status() -> object | None:
        return await fetch_status(address) if address is not None else None

    return HealthWatch(
        interval_s=s.health_interval_s, policy=policy(HealthPolicy, s),
        ladder=policy(LadderPolicy, s), read_status=read_status,
        read_totals=metrics_reader(totals_client, daemon.note_answer), gpus=gpus,
        daemon=daemon, time_scale=s.rate_time_scale,
        manager_min_rate=min_rate or MANAGER_DEFAULT_MIN_RATE, **collaborators,
    )  # fmt: skip


# --- 5. the servers, and the run ----------------------------------------------------------------


async def run(
    s: Settings,
    runtime: Runtime,
    edges: Edges,
    machine: Machine = HOST,
    *,
    on_phase: Callable[[str], None] | None = None,
) -> int:
    """The state file and the outbox opened, the lifecycle built on ``machine``'s probes, the
    health server and the metrics when the health server is on; the lifecycle run to its exit
    code (``STATE_UNWRITABLE`` when the state file cannot be opened)."""
    from cuzk_supervisor import exitcodes
    from cuzk_supervisor.adapters.state import STATE_FILE
    from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore, StateWriteError
    from cuzk_supervisor.serve.metricsink import NoMetrics

    try:
        keeper = StateKeeper(StateStore(s.state_dir / STATE_FILE))
    except StateWriteError as exc:
        print(f"cuzk-supervisor run: {exc}", file=sys.stderr)
        return exitcodes.STATE_UNWRITABLE
    async with edges.manager:

        def build(metrics: MetricsSink) -> Lifecycle:
            lifecycle = build_lifecycle(
                s, runtime, edges, state=keeper, sampler=machine.memory_sampler(s),
                gpu=machine.gpu_probe(s), metrics=metrics, gpu_health=machine.gpu_health(s),
            )  # fmt: skip
            if on_phase is not None:
                lifecycle.phase_listeners.append(on_phase)
            return lifecycle

        if not s.health_enabled:
            # No /metrics would read them: a stand-in that keeps nothing, so a run without the
            # health server never loads the metrics.
            return await build(NoMetrics()).run()
        # The health server and the metrics registry only when the server is on.
        from cuzk_supervisor.lifecycle.machine import LifecycleSource
        from cuzk_supervisor.serve.health import HealthServer
        from cuzk_supervisor.serve.metrics import SupervisorMetrics
        from cuzk_supervisor.serve.probes import StartupLatch

        metrics = SupervisorMetrics()
        lifecycle = build(metrics)
        # /startupz passes once a phase after warmup is entered (the daemon answered).
        startup = StartupLatch()
        lifecycle.phase_listeners.append(startup.on_phase)
        # Started here, not in the lifecycle's task group, so a busy port is a plain one-line
        # error (exit 2) rather than an exception group.
        # refresh: read at scrape time (a len() on the loop, always current).
        async with HealthServer(
            s.health_listen, LifecycleSource(lifecycle), metrics,
            allow_public=s.health_allow_public, startup=startup,
            refresh=lambda: metrics.outbox_depth(len(lifecycle.outbox.pending)),
        ):  # fmt: skip
            return await lifecycle.run()
