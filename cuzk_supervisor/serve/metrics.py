"""The supervisor's Prometheus metrics (``/metrics``), each instance with its own families.

Tests build as many ``SupervisorMetrics`` as they like; nothing is registered process-wide.
Updates are small typed methods the lifecycle calls where things happen (label children are bound
once, up front); ``serve.exposition`` renders the text format when ``/metrics`` is scraped.

Names follow the Prometheus conventions: a counter counts what its name says (daemon *exits*, by
kind; a restart is what may follow one), ``_bytes`` gauges say what they measure (capacity, used),
and no ``<name>_created`` series is exported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from cuzk_supervisor.adapters.machine.gpu import GpuDevice
from cuzk_supervisor.core.bound import Bound, Verdict
from cuzk_supervisor.core.exits import ExitKind
from cuzk_supervisor.core.health import KINDS as HEALTH_KINDS
from cuzk_supervisor.core.risk import RiskLevel
from cuzk_supervisor.serve.exposition import Counter, Family, Gauge, Histogram, render
from cuzk_supervisor.version import VERSION

NAN = math.nan

# The classic text format (serve.exposition writes it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The lifecycle's phases in order (docs/architecture.md); each gets a series up front so a
# dashboard sees every phase at 0 before the first transition. An unknown name still works (added
# on the fly).
PHASES: tuple[str, ...] = (
    "start",
    "register",
    "params",
    "plan",
    "warmup",
    "restart",
    "settle",
    "bench",
    "report",
    "run",
)

# From a simulated proof (0.1 s) to a first real warmup that builds the PCE cache (up to an hour).
PROOF_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
    3600,
)


class SupervisorMetrics:
    """Every metric the supervisor exports; ``render()`` is the ``/metrics`` body."""

    def __init__(self, *, phase: str = "start", clock: Callable[[], float] = time.time) -> None:
        self.registry: list[Family] = []
        r = self.registry

        up = Gauge("cuzk_supervisor_up", "1 while the supervisor process runs", registry=r)
        up.set(1)
        built = Gauge(
            "cuzk_supervisor_build_info",
            "1, labelled with the supervisor's version",
            ["version"],
            registry=r,
        )
        built.labels(version=VERSION).set(1)
        started = Gauge(
            "cuzk_supervisor_start_time_seconds",
            "When the supervisor started, seconds since the Unix epoch",
            registry=r,
        )
        started.set(clock())

        self._phase = Gauge(
            "cuzk_supervisor_phase",
            "1 for the lifecycle phase the supervisor is in, 0 for the others",
            ["phase"],
            registry=r,
        )
        self._phases = {name: self._phase.labels(phase=name) for name in PHASES}
        self._current_phase = ""

        self._exits = Counter(
            "cuzk_supervisor_daemon_exits",
            "Daemon exits seen by the keeper, by exit kind (each is followed by a restart "
            "unless it was permanent or ended a crash loop)",
            ["kind"],
            registry=r,
        )
        for kind in ExitKind:  # every kind's series up front, at 0
            self._exits.labels(kind=kind.value)

        self._completed = Counter(
            "cuzk_supervisor_proofs_completed", "Proofs that completed", registry=r
        )
        self._failed = Counter(
            "cuzk_supervisor_proofs_failed",
            "Proof attempts that failed (daemon FAILED, lost job, budget spent)",
            registry=r,
        )
        self._duration = Histogram(
            "cuzk_supervisor_proof_duration_seconds",
            "Wall time of completed proofs, submit to result",
            buckets=PROOF_BUCKETS,
            registry=r,
        )
        self._rate = Gauge(
            "cuzk_supervisor_bench_rate_proofs_per_hour",
            "The benchmark's rate, as reported to the manager (0 until measured)",
            registry=r,
        )
        self._rate_uncertainty = Gauge(
            "cuzk_supervisor_bench_rate_uncertainty_ratio",
            "Half-width of the 95 % interval of the benchmark's rate, as a share of it (NaN "
            "until measured or where the batch could not tell)",
            registry=r,
        )
        self._rate_uncertainty.set(NAN)
        self._bound = Gauge(
            "cuzk_supervisor_bench_bound",
            "1 for what bounded the benchmark's rate (gpu-bound, gpu-stage-bound, "
            "synthesis-bound, feed-bound, mixed, unknown; "
            "docs/benchmark.md 'What bounds the rate'), 0 for the others; all 0 until judged or "
            "with bench_status_sample_s 0",
            ["bound"],
            registry=r,
        )
        self._bounds = {b.value: self._bound.labels(bound=b.value) for b in Bound}
        self._gpu_busy = Gauge(
            "cuzk_supervisor_bench_gpu_busy_share",
            "Share of the measured stretch each GPU had a worker proving, from the daemon's "
            "status (NaN until judged)",
            registry=r,
        )
        self._limiter_use = Gauge(
            "cuzk_supervisor_bench_synthesis_limiter_use",
            "Mean share of the partition workers' synthesis capacity in use over the measured "
            "stretch (docs/benchmark.md 'What bounds the rate'; NaN until judged)",
            registry=r,
        )
        for unjudged in (self._gpu_busy, self._limiter_use):
            unjudged.set(NAN)
        self._projected = Gauge(
            "cuzk_supervisor_bench_projected_rate_proofs_per_hour",
            "The model's rate for one change of the measured plan (as-run, more-workers, "
            "one-more-in-flight, one-more-gpu): a figure with its assumptions, not a promise; "
            "no series until judged",
            ["projection"],
            registry=r,
        )
        self._headroom = Gauge(
            "cuzk_supervisor_memory_headroom_bytes",
            "Memory left under the effective limit (lower of host RAM and cgroup limit)",
            registry=r,
        )
        self._risk = Gauge(
            "cuzk_supervisor_oom_risk_level",
            "OOM risk from the memory watch: 0 ok, 1 warn, 2 critical",
            registry=r,
        )
        self._gpu_used = Gauge(
            "cuzk_supervisor_gpu_memory_used_bytes",
            "GPU memory in use, per device that answered the last sample",
            ["gpu", "name"],
            registry=r,
        )
        self._gpu_capacity = Gauge(
            "cuzk_supervisor_gpu_memory_capacity_bytes",
            "GPU memory capacity (what the device has in all), per device that answered the last "
            "sample",
            ["gpu", "name"],
            registry=r,
        )
        self._gpu_labels: set[tuple[str, str]] = set()
        self._reconnects = Counter(
            "cuzk_supervisor_grpc_reconnects",
            "Daemon channels replaced after two calls in a row were cut with nothing received "
            "(a silent connection: frozen path or stopped peer)",
            registry=r,
        )
        self._outbox = Gauge(
            "cuzk_supervisor_manager_outbox_depth",
            "Reports to the manager queued and not yet acknowledged",
            registry=r,
        )
        self._manager_failed = Counter(
            "cuzk_supervisor_manager_failed_requests",
            "Requests to the manager that failed and were retried under its one shared backoff "
            "(refused, timed out, 5xx, 408, 429, an answer that cannot be the manager's), by call",
            ["call"],
            registry=r,
        )
        self._weather = Gauge(
            "cuzk_supervisor_manager_weather",
            "1 while the manager's URL has answered with pages that are not the manager's (a "
            "proxy's HTML or plain 404, 403, 5xx ...) for manager_weather_s or more: nothing is "
            "ended by them, reports are kept and retried; 0 otherwise",
            registry=r,
        )
        self._health_dropped = Counter(
            "cuzk_supervisor_health_connections_dropped",
            "Health server connections closed without an answer, by reason (disconnect: the "
            "client left early; head_timeout: its request head was too slow; evicted: a slow "
            "one made room at the connection cap; refused: every slot was answering)",
            ["reason"],
            registry=r,
        )
        self._health_level = Gauge(
            "cuzk_supervisor_health_level",
            "The run phase's health: 0 healthy, 1 degraded, 2 broken (docs/run-phase.md)",
            registry=r,
        )
        self._health_finding = Gauge(
            "cuzk_supervisor_health_finding",
            "1 for each kind of trouble the run phase's health watch finds now, 0 for the others",
            ["kind"],
            registry=r,
        )
        self._health_findings = {k: self._health_finding.labels(kind=k) for k in HEALTH_KINDS}
        self._health_actions = Counter(
            "cuzk_supervisor_health_actions",
            "What the health watch did about a finding: restart (the daemon), tell (the manager)",
            ["action"],
            registry=r,
        )
        self.set_phase(phase)

    # --- updates ------------------------------------------------------------------------------

    def set_phase(self, name: str) -> None:
        name = str(name)
        if name == self._current_phase:
            return
        previous = self._phases.get(self._current_phase)
        if previous is not None:
            previous.set(0)
        child = self._phases.get(name)
        if child is None:
            child = self._phases[name] = self._phase.labels(phase=name)
        child.set(1)
        self._current_phase = name

    def daemon_exit(self, kind: ExitKind | str) -> None:
        self._exits.labels(kind=str(kind)).inc()  # ExitKind is a StrEnum: str() is its value

    def proof_finished(self, ok: bool, seconds: float) -> None:
        """One proof attempt ended. Only completed proofs go into the duration histogram: a
        failure's wall time is a deadline or a crash, not how long proving takes."""
        if ok:
            self._completed.inc()
            self._duration.observe(max(0.0, seconds))
        else:
            self._failed.inc()

    def bench_rate(self, rate: float, uncertainty: float | None = None) -> None:
        """The rate reported, with its 95 % half-width as a share (None: not known)."""
        self._rate.set(rate)
        self._rate_uncertainty.set(NAN if uncertainty is None else uncertainty)

    def bench_bound(self, verdict: Verdict | None) -> None:
        """What bounded the rate (:func:`cuzk_supervisor.core.bound.judge`); None: not judged."""
        for name, child in self._bounds.items():
            child.set(1 if verdict is not None and name == verdict.bound.value else 0)
        evidence = verdict.evidence if verdict is not None else None
        for gauge, figure in (
            (self._gpu_busy, evidence.gpu_busy_share if evidence else None),
            (self._limiter_use, evidence.synthesis_load if evidence else None),
        ):
            gauge.set(NAN if figure is None else figure)
        self._projected.clear()
        for projection in verdict.projections if verdict is not None else ():
            self._projected.labels(projection=projection.name).set(projection.rate_per_hour)

    def memory(self, headroom_bytes: int, level: RiskLevel) -> None:
        self._headroom.set(headroom_bytes)
        self._risk.set(level.severity)

    def gpus(self, devices: Iterable[GpuDevice]) -> None:
        """The devices that answered this sample; a device missing now loses its series rather
        than showing its last value for ever."""
        seen: set[tuple[str, str]] = set()
        for device in devices:
            labels = (str(device.index), device.name)
            seen.add(labels)
            self._gpu_used.labels(*labels).set(device.used_bytes)
            self._gpu_capacity.labels(*labels).set(device.total_bytes)
        for labels in self._gpu_labels - seen:
            self._gpu_used.remove(*labels)
            self._gpu_capacity.remove(*labels)
        self._gpu_labels = seen

    def grpc_reconnect(self) -> None:
        """The proving client replaced its channel (``ProvingClient(on_reconnect=...)``)."""
        self._reconnects.inc()

    def outbox_depth(self, n: int) -> None:
        self._outbox.set(n)

    def manager_request_failed(self, call: str) -> None:
        """One failed request to the manager (``ManagerClient.add_retry_listener``)."""
        self._manager_failed.labels(call=call).inc()

    def manager_weather(self, sustained: bool, answer: str) -> None:
        """A sustained weather episode began or ended (``ManagerClient.add_weather_listener``)."""
        self._weather.set(1 if sustained else 0)

    def health_connection_dropped(self, reason: str) -> None:
        self._health_dropped.labels(reason=reason).inc()

    def health(self, level: int, kinds: Iterable[str]) -> None:
        """The health watch's latest assessment: its level and the kinds it found."""
        self._health_level.set(level)
        found = set(kinds)
        for kind in found - self._health_findings.keys():
            self._health_findings[kind] = self._health_finding.labels(kind=kind)
        for kind, child in self._health_findings.items():
            child.set(1 if kind in found else 0)

    def health_action(self, step: str) -> None:
        self._health_actions.labels(action=step).inc()

    # --- exposition ---------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self._current_phase

    def render(self) -> bytes:
        """The text exposition format (``CONTENT_TYPE``)."""
        return render(self.registry)
