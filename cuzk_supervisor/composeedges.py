"""The builder of the edges: what faces the manager, made from the settings.

The instance's label and minimum rate, the manager client and the log shipper (``Edges``, made
before logging is configured: the shipper is a log processor), and the reporter over them. The
composition root (``compose``) builds a run's edges here; the fleet bench (``bench/_fleet.py``)
its virtual machines', with its own transport, clocks and random streams. What would load the
manager's HTTP client is imported where it is built, not at the top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy

if TYPE_CHECKING:
    import random

    from cuzk_supervisor.adapters.logship.shipper import LogShipper
    from cuzk_supervisor.adapters.manager.client import ManagerClient
    from cuzk_supervisor.adapters.state.store import StateKeeper
    from cuzk_supervisor.lifecycle.reporting import Reporter
    from cuzk_supervisor.lifecycle.retries import LifecycleRetries
    from cuzk_supervisor.lifecycle.shared import Progress, Signals
    from cuzk_supervisor.serve.metricsink import MetricsSink


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


MANAGER_DEFAULT_MIN_RATE = 50.0
"""What the manager holds a rate to when /register sent ``min_rate`` 0 (reference/manager-api)."""


def bench_min_rate(s: Settings, min_rate: float) -> float:
    """The minimum rate the adaptive stop judges against, on the bench's clock: the ``min_rate``
    sent to /register (0: the manager's default), times ``rate_time_scale``; 0 in a local run
    (no manager: nobody judges the rate)."""
    if not s.manager_url:
        return 0.0
    return (min_rate or MANAGER_DEFAULT_MIN_RATE) * s.rate_time_scale


@dataclass(frozen=True)
class Edges:
    """What is made before logging is configured: nothing is connected or written yet."""

    label: str
    min_rate: float
    manager: ManagerClient
    shipper: LogShipper


def open_edges(s: Settings, environ: Mapping[str, str]) -> Edges:
    """The label and minimum rate (``UsageError`` for none, or a bad ``MIN_RATE``), the manager
    client and the log shipper (it pushes through the manager client when ``log_push``)."""
    return build_edges(s, resolve_label(s, environ), resolve_min_rate(s, environ))


def build_edges(
    s: Settings,
    label: str,
    min_rate: float,
    *,
    shipper_rng: random.Random | None = None,
    **client: Any,
) -> Edges:
    """The manager client the settings describe and the log shipper, for ``label``; ``client``:
    what the client is given beyond the settings (the fleet bench's transport, clocks, rng)."""
    from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
    from cuzk_supervisor.adapters.manager.client import ManagerClient
    from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerTimeouts

    manager = ManagerClient(
        s.manager_url or None,
        timeouts=policy(ManagerTimeouts, s),
        retry=policy(ManagerRetry, s),
        headers={"Authorization": f"Bearer {s.manager_token}"} if s.manager_token else None,
        weather_s=s.manager_weather_s,
        **client,
    )
    shipper = LogShipper(
        manager if s.log_push else None, policy(ShipperSettings, s), rng=shipper_rng
    )
    return Edges(label, min_rate, manager, shipper)


def build_reporter(
    s: Settings,
    edges: Edges,
    *,
    state: StateKeeper,
    signals: Signals,
    progress: Progress,
    retries: LifecycleRetries,
    metrics: MetricsSink,
    **clocks: Any,
) -> Reporter:
    """The reporter on the edges: its outbox on ``state``, its listener and the metrics' (a
    failed attempt, weather) on the manager client; ``clocks``: the fleet bench's clocks, rng."""
    from cuzk_supervisor.adapters.manager.outbox import Outbox
    from cuzk_supervisor.lifecycle.reporting import Reporter
    from cuzk_supervisor.lifecycle.values import ReporterSettings

    manager = edges.manager
    reporter = Reporter(
        policy(ReporterSettings, s), label=edges.label, min_rate=edges.min_rate,
        manager=manager, state=state, outbox=Outbox.for_keeper(manager, state),
        shipper=edges.shipper, signals=signals, progress=progress, retries=retries, **clocks,
    )  # fmt: skip
    manager.add_retry_listener(reporter.on_manager_retry)
    manager.add_retry_listener(lambda call, *_: metrics.manager_request_failed(call))
    manager.add_weather_listener(metrics.manager_weather)
    return reporter
