"""What the simulated manager was asked and what it cost it, per endpoint: requests, bytes in
(request line, headers and body as read) and bytes out (status line, headers and body as
written), answers by status, faulted and throttled answers, requests applied; and, per instance,
how many times each report was applied (``/param-done``, ``/bench-done``, ``/running``), so a
fleet benchmark can tell a report lost (never applied) from one applied twice.

``/sim/`` requests are the sim's own control and are not counted. Read with ``GET
/sim/counters`` (``?reports=1`` adds the per-instance counts) or, in process,
``App.counters.snapshot()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The reports counted per instance (the uuid of their JSON body).
REPORT_PATHS = ("/param-done", "/bench-done", "/running")
OTHER = "other"  # a path no route serves (the dashboard's catch-all, 404s)


@dataclass(slots=True)
class EndpointCount:
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    faulted: int = 0  # answered by a fault switch (throttled ones included)
    throttled: int = 0  # answered by the throttle switch (429/503 with Retry-After as set)
    applied: int = 0  # reached the handler (may have changed state)
    statuses: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "faulted": self.faulted,
            "throttled": self.throttled,
            "applied": self.applied,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


class Counters:
    """Thread-safe running totals since the manager started (never reset: diff two
    snapshots for a window)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._endpoints: dict[str, EndpointCount] = {}
        self._reports: dict[str, dict[str, int]] = {path: {} for path in REPORT_PATHS}

    def record(
        self,
        endpoint: str,
        *,
        status: int,
        bytes_in: int,
        bytes_out: int,
        faulted: bool = False,
        throttled: bool = False,
        applied: bool = False,
    ) -> None:
        with self._lock:
            count = self._endpoints.get(endpoint)
            if count is None:
                count = self._endpoints[endpoint] = EndpointCount()
            count.requests += 1
            count.bytes_in += bytes_in
            count.bytes_out += bytes_out
            count.faulted += int(faulted)
            count.throttled += int(throttled)
            count.applied += int(applied)
            count.statuses[status] = count.statuses.get(status, 0) + 1

    def report_applied(self, path: str, uuid: str) -> None:
        """A report (one of REPORT_PATHS) was applied for ``uuid`` (answered 2xx)."""
        with self._lock:
            per_uuid = self._reports.get(path)
            if per_uuid is not None:
                per_uuid[uuid] = per_uuid.get(uuid, 0) + 1

    def endpoint(self, endpoint: str) -> EndpointCount:
        """A copy of one endpoint's totals (zeros if never asked)."""
        with self._lock:
            count = self._endpoints.get(endpoint, EndpointCount())
            return EndpointCount(
                count.requests,
                count.bytes_in,
                count.bytes_out,
                count.faulted,
                count.throttled,
                count.applied,
                dict(count.statuses),
            )

    def reports(self, path: str) -> dict[str, int]:
        """Times each uuid's ``path`` report was applied."""
        with self._lock:
            return dict(self._reports.get(path, {}))

    def snapshot(self, *, reports: bool = False) -> dict[str, Any]:
        """Every endpoint's totals and the sums (``reports``: the per-instance counts too)."""
        with self._lock:
            endpoints = {name: c.to_json() for name, c in sorted(self._endpoints.items())}
            per_uuid = {path: dict(v) for path, v in self._reports.items()} if reports else None
        totals = {
            key: sum(e[key] for e in endpoints.values())
            for key in ("requests", "bytes_in", "bytes_out", "faulted", "throttled", "applied")
        }
        out: dict[str, Any] = {
            "since": self._started,
            "at": self._clock(),
            "endpoints": endpoints,
            "totals": totals,
        }
        if per_uuid is not None:
            out["reports"] = per_uuid
        return out
