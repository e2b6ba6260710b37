"""What the lifecycle records its metrics through, and the stand-in when nothing serves them.

``MetricsSink`` is the updates of ``serve.metrics.SupervisorMetrics`` as a protocol; the
lifecycle's collaborators are typed with it. ``NoMetrics`` has the same methods and records
nothing: ``run`` gives it to the lifecycle when the health server is off (``health_enabled``
false), since no ``/metrics`` would ever read the series, and such a run never loads the
metrics nor the server. This module imports nothing at run time beyond ``typing``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.machine.gpu import GpuDevice
    from cuzk_supervisor.core.bound import Verdict
    from cuzk_supervisor.core.exits import ExitKind
    from cuzk_supervisor.core.risk import RiskLevel


class MetricsSink(Protocol):
    """The updates the lifecycle makes where things happen (see ``SupervisorMetrics``)."""

    def set_phase(self, name: str) -> None: ...

    def daemon_exit(self, kind: ExitKind | str) -> None: ...

    def proof_finished(self, ok: bool, seconds: float) -> None: ...

    def bench_rate(self, rate: float, uncertainty: float | None = None) -> None: ...

    def bench_bound(self, verdict: Verdict | None) -> None: ...

    def memory(self, headroom_bytes: int, level: RiskLevel) -> None: ...

    def gpus(self, devices: Iterable[GpuDevice]) -> None: ...

    def grpc_reconnect(self) -> None: ...

    def outbox_depth(self, n: int) -> None: ...

    def manager_request_failed(self, call: str) -> None: ...

    def manager_weather(self, sustained: bool, answer: str) -> None: ...

    def health_connection_dropped(self, reason: str) -> None: ...

    def health(self, level: int, kinds: Iterable[str]) -> None: ...

    def health_action(self, step: str) -> None: ...

    @property
    def phase(self) -> str: ...


class NoMetrics:
    """A ``MetricsSink`` that keeps nothing but the phase name (read as ``phase``)."""

    def __init__(self, *, phase: str = "start") -> None:
        self._phase = str(phase)

    def set_phase(self, name: str) -> None:
        self._phase = str(name)

    def daemon_exit(self, kind: ExitKind | str) -> None:
        pass

    def proof_finished(self, ok: bool, seconds: float) -> None:
        pass

    def bench_rate(self, rate: float, uncertainty: float | None = None) -> None:
        pass

    def bench_bound(self, verdict: Verdict | None) -> None:
        pass

    def memory(self, headroom_bytes: int, level: RiskLevel) -> None:
        pass

    def gpus(self, devices: Iterable[GpuDevice]) -> None:
        pass

    def grpc_reconnect(self) -> None:
        pass

    def outbox_depth(self, n: int) -> None:
        pass

    def manager_request_failed(self, call: str) -> None:
        pass

    def manager_weather(self, sustained: bool, answer: str) -> None:
        pass

    def health_connection_dropped(self, reason: str) -> None:
        pass

    def health(self, level: int, kinds: Iterable[str]) -> None:
        pass

    def health_action(self, step: str) -> None:
        pass

    @property
    def phase(self) -> str:
        return self._phase
