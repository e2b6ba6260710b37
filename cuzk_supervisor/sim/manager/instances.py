"""The simulated fleet manager's records: an instance's states, the real kill reasons, an
instance as ``GET /status`` lists it, what a sweep or a bench report did to it, and the times
as the real manager writes them (Go's RFC3339Nano; SQLite's ``CURRENT_TIMESTAMP``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

REGISTERED = "registered"
PARAMS_DONE = "params_done"
BENCH_DONE = "bench_done"
RUNNING = "running"
KILLED = "killed"
STATES = (REGISTERED, PARAMS_DONE, BENCH_DONE, RUNNING, KILLED)

DEFAULT_MIN_RATE = 50.0  # what /register uses when min_rate <= 0
PARAM_TIMEOUT_REASON = "param fetch timeout (90min)"  # the real texts, whatever the timeout
BENCH_TIMEOUT_REASON = "benchmark timeout (45min)"
MANUAL_KILL_REASON = "manually killed via UI"
DISAPPEARED_REASON = "instance disappeared from vast"


def rfc3339(ts: float) -> str:
    """``ts`` (unix seconds) as Go's RFC3339Nano in UTC: trailing zeros of the fraction cut."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    base = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def sql_time(ts: float) -> str:
    """``ts`` as SQLite's ``CURRENT_TIMESTAMP`` writes it: whole seconds, UTC."""
    return datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def effective_min_rate(min_rate: float) -> float:
    """``min_rate <= 0`` means the register default, 50 proofs per hour."""
    return min_rate if min_rate > 0 else DEFAULT_MIN_RATE


def bench_fail_reason(rate: float, min_rate: float) -> str:
    """As the real manager writes it (Go's ``%.1f``)."""
    return f"bench_rate {rate:.1f} below min_rate {min_rate:.1f}"


@dataclass(frozen=True, slots=True)
class Instance:
    """One row of ``instances``; ``to_json`` is the shape ``GET /status`` lists."""

    uuid: str
    label: str
    runner_id: int
    state: str
    min_rate: float
    registered_at: float
    param_done_at: float | None = None
    bench_done_at: float | None = None
    bench_rate: float | None = None
    killed_at: float | None = None
    kill_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uuid": self.uuid,
            "label": self.label,
            "runner_id": self.runner_id,
            "state": self.state,
            "min_rate": self.min_rate,
            "registered_at": sql_time(self.registered_at),
        }
        for name in ("param_done_at", "bench_done_at", "killed_at"):
            value = getattr(self, name)
            if value is not None:
                out[name] = sql_time(value)
        if self.bench_rate is not None:
            out["bench_rate"] = self.bench_rate
        if self.kill_reason is not None:
            out["kill_reason"] = self.kill_reason
        return out

    @classmethod
    def from_row(cls, row: sqlite3.Row | tuple[Any, ...]) -> Instance:
        return cls(*row)


@dataclass(frozen=True, slots=True)
class SweepKill:
    instance: Instance  # as it is after the kill
    cause: str  # "timeout", "bench below min_rate", "bad host", "disappeared"
    destroyed: bool  # whether the real manager would destroy the container too
    state_before: str = ""  # the record's state when it was killed


@dataclass(frozen=True, slots=True)
class BenchResult:
    instance: Instance  # as it is after the report
    passed: bool
