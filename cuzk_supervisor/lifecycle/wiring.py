"""The one place the phase machine and its collaborators are built and connected.

``build_lifecycle`` takes the edges the ``run`` command opened (the manager client, the state
file, the log shipper, the samplers) and returns a :class:`~.machine.Lifecycle` given its
collaborators: daemon control, proof attempts, the step-down, manager reporting and the monitors,
sharing one ``Progress`` and one ``Signals``. Tests of the phase machine build it with fakes
instead (tests/test_phase_machine.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence

from cuzk_supervisor.adapters import params
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.machine.gpu import GpuDevice, GpuProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler, MemorySnapshot
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.proving.client import ProvingClient
from cuzk_supervisor.adapters.state.store import StateKeeper
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.core.risk import RiskPolicy
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.daemon.process import Spawner
from cuzk_supervisor.daemon.status import active_partitions
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.lifecycle import assemble
from cuzk_supervisor.lifecycle.daemonctl import DaemonControl
from cuzk_supervisor.lifecycle.machine import Lifecycle
from cuzk_supervisor.lifecycle.memwatch import MemoryWatch
from cuzk_supervisor.lifecycle.monitors import Monitors
from cuzk_supervisor.lifecycle.proofs import ProofRunner
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.stepdown import StepDown
from cuzk_supervisor.runtime import Runtime
from cuzk_supervisor.serve.metricsink import MetricsSink
from cuzk_supervisor.settings import Settings


def resolve_label(settings: Settings, environ: Mapping[str, str]) -> str:
    label = settings.label or environ.get("VAST_CONTAINERLABEL", "").strip()
    if not label:
        raise UsageError(
            "no instance label: set --label (CUZK_SUPERVISOR_LABEL) or VAST_CONTAINERLABEL"
        )
    return label


def resolve_min_rate(settings: Settings, environ: Mapping[str, str]) -> float:
    if settings.min_rate:
        return settings.min_rate
    raw = environ.get("MIN_RATE", "").strip()
    if not raw:
        return 0.0  # the manager applies its default (50)
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"MIN_RATE={raw!r} is not a number of proofs per hour") from None
    if value < 0:
        raise UsageError(f"MIN_RATE={raw!r} must be >= 0")
    return value


class PlanResources:
    """Memory and GPUs as the plan sees them (NVML can stall: never in the event loop)."""

    def __init__(self, sampler: MemorySampler, gpu: GpuProbe) -> None:
        self._sampler = sampler
        self._gpu = gpu

    def sample(self) -> MemorySnapshot:
        return self._sampler.sample()

    async def gpus(self) -> Sequence[GpuDevice]:
        if not self._gpu.available:
            return []
        return await asyncio.to_thread(self._gpu.devices)


class ParamsFetch:
    """The params phase's effect: the fetch command run under the reaper, its output shipped
    to the setup tab, its progress logged (``params.progress``: the terminal view's live line),
    the files verified."""

    def __init__(self, settings: Settings, spawn: Spawner, shipper: LogShipper) -> None:
        self.s = settings
        self._spawn = spawn
        self._shipper = shipper

    async def __call__(self, expected: Sequence[params.ExpectedFile], fetch_command: str) -> None:
        pump = OutputPump("setup", None)
        pump.add_listener(self._shipper.listener("setup"))
        await params.ensure_params(
            self.s.daemon_param_cache,
            expected,
            fetch_command,
            timeout_s=self.s.params_timeout_s,
            progress_interval_s=self.s.params_progress_interval_s,
            spawn=self._spawn,
            pump=pump,
            pidfile=self.s.state_dir / "fetch.pid",
        )


def build_lifecycle(
    settings: Settings,
    runtime: Runtime,
    *,
    label: str,
    min_rate: float,
    manager: ManagerClient,
    state: StateKeeper,
    outbox: Outbox,
    shipper: LogShipper,
    sampler: MemorySampler,
    gpu: GpuProbe,
    risk_policy: RiskPolicy | None = None,
    metrics: MetricsSink | None = None,
    retries: LifecycleRetries | None = None,
) -> Lifecycle:
    s = settings
    if metrics is None:
        # Not at the top: prometheus_client is loaded only where metrics are kept (``run``
        # gives a ``NoMetrics`` when the health server is off).
        from cuzk_supervisor.serve.metrics import SupervisorMetrics

        metrics = SupervisorMetrics()
    retries = retries or LifecycleRetries()
    spawn = runtime.reaper.spawn
    progress, signals = Progress(), Signals()
    memory_policy = assemble.memory_policy(s)
    # The watch samples the daemon's process tree: the pid is the daemon control's, read late.
    watch = MemoryWatch(sampler, risk_policy or assemble.risk_policy(s), lambda: daemon.pid())
    watch.add_listener(lambda a: metrics.memory(a.headroom_bytes, a.level))
    daemon = DaemonControl(
        s, spawn=spawn, watch=watch, metrics=metrics, shipper=shipper, signals=signals,
        progress=progress, memory_policy=memory_policy,
        cgroup_dir=sampler.cgroup.dir if sampler.cgroup else None,
    )  # fmt: skip
    reporter = Reporter(
        s, label=label, min_rate=min_rate, manager=manager, state=state, outbox=outbox,
        shipper=shipper, signals=signals, progress=progress, retries=retries,
    )  # fmt: skip
    manager.add_retry_listener(reporter.on_manager_retry)
    client_factory = functools.partial(
        ProvingClient,
        parse_address(assemble.daemon_listen(s)),
        assemble.proving_timeouts(s),
        on_reconnect=metrics.grpc_reconnect,
    )
    proofs = ProofRunner(
        daemon=daemon, client_factory=client_factory, c1_file=s.c1_file, signals=signals,
        progress=progress, metrics=metrics, shipper=shipper, retry=retries.proof,
        proof_budget_s=s.proof_budget_s, rate_time_scale=s.rate_time_scale,
    )  # fmt: skip
    stepdown = StepDown(
        daemon=daemon, watch=watch, signals=signals, progress=progress,
        memory_policy=memory_policy,
        active_partitions=lambda: active_partitions(s.daemon_status_listen),
    )  # fmt: skip
    monitors = Monitors(
        s, progress=progress, signals=signals, watch=watch, gpu=gpu, metrics=metrics,
        daemon=daemon, manager=reporter,
    )  # fmt: skip
    return Lifecycle(
        s=s, state=state, shipper=shipper, metrics=metrics, memory_policy=memory_policy,
        bench_policy=assemble.bench_policy(s), progress=progress, signals=signals,
        resources=PlanResources(sampler, gpu),
        fetch_params=ParamsFetch(s, spawn, shipper), daemon=daemon, proofs=proofs,
        stepdown=stepdown, reporter=reporter, monitors=monitors,
    )  # fmt: skip
