"""The state document: what the supervisor remembers across a container restart, as frozen
values, and its versioned JSON form.

:class:`SupervisorState` holds the phase, the instance's identity at the manager, the plan, the
benchmark records (:class:`BenchRecord`), a terminal verdict, the last failures and the reports
to the manager (:class:`Report`). Change it with ``dataclasses.replace`` (or the ``with_*``
helpers); :meth:`SupervisorState.from_json` raises :class:`StateFormatError`, saying what is
wrong, for a document this build cannot read. No I/O here: the file is ``state.store``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid as uuid_mod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cuzk_supervisor.adapters.state.fields import Fields, StateFormatError, object_fields, str_item
from cuzk_supervisor.core.reports import BENCH_DONE, REPORT_KINDS, REPORT_OUTCOMES

STATE_VERSION = 1
MAX_FAILURES = 20
"""Failure reasons kept (the most recent ones)."""
MAX_BENCH_RESULTS = 20
"""Benchmark results kept (the most recent ones)."""


def utc_now_iso(clock: Callable[[], float] = time.time) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.000Z``."""
    stamp = datetime.fromtimestamp(clock(), tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class BenchRecord:
    """One measured benchmark, with the plan that produced it (incident I6: keep the figures)."""

    rate: float
    """Proofs per hour."""
    completed: int
    wall_s: float
    plan: Mapping[str, Any] = field(default_factory=dict)
    at: str = field(default_factory=utc_now_iso)
    measurement: Mapping[str, Any] = field(default_factory=dict)
    """How the rate was measured (:meth:`cuzk_supervisor.core.bench.RateMeasurement.to_dict`, plus
    the budget left): proofs counted, interval, concurrency, excluded restarts."""
    bound: Mapping[str, Any] = field(default_factory=dict)
    """What bounded the rate, with its figures and projections
    (:meth:`cuzk_supervisor.core.bound.Verdict.to_dict`); empty when the status was not sampled."""

    def to_dict(self) -> dict[str, Any]:
        document = {
            "rate": self.rate,
            "completed": self.completed,
            "wall_s": self.wall_s,
            "plan": dict(self.plan),
            "at": self.at,
            "measurement": dict(self.measurement),
        }
        if self.bound:
            document["bound"] = dict(self.bound)
        return document


@dataclass(frozen=True, slots=True)
class Report:
    """One report to the manager, pending in the outbox or finished (``outcome`` set). ``id`` is
    stable across restarts: the lifecycle finds a report it queued before a crash by it (or by
    kind, :meth:`cuzk_supervisor.adapters.manager.outbox.Outbox.latest`)."""

    kind: str
    """One of :data:`REPORT_KINDS`."""
    uuid: str
    """The instance's uuid at the manager."""
    rate: float | None = None
    """Proofs per hour; bench_done only."""
    id: str = field(default_factory=lambda: str(uuid_mod.uuid4()))
    created_at: str = field(default_factory=utc_now_iso)
    outcome: str | None = None
    """None while pending; then ``ok``, ``gone`` (404: instance killed) or ``rejected`` (4xx)."""
    passed: bool | None = None
    """The manager's verdict, bench_done with outcome ``ok`` only."""
    detail: str = ""
    """Why it was gone or rejected (the manager's error message)."""
    finished_at: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in REPORT_KINDS:
            raise ValueError(f"unknown report kind {self.kind!r}")
        if not self.uuid:
            raise ValueError("a report needs the instance uuid")
        if self.kind == BENCH_DONE:
            # NaN or inf would serialise as invalid JSON; the manager would answer 400.
            if self.rate is None or not math.isfinite(self.rate) or self.rate < 0:
                raise ValueError(f"bench_done needs a finite rate >= 0, got {self.rate!r}")
        elif self.rate is not None:
            raise ValueError(f"{self.kind} carries no rate")
        if self.outcome is not None and self.outcome not in REPORT_OUTCOMES:
            raise ValueError(f"unknown report outcome {self.outcome!r}")

    @property
    def pending(self) -> bool:
        return self.outcome is None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """Everything the supervisor must remember across a container restart. ``plan`` is opaque
    here (the policy module owns its shape); treat it as read-only."""

    phase: str = "start"
    uuid: str | None = None
    runner_id: int | None = None
    label: str | None = None
    plan: Mapping[str, Any] | None = None
    pce_ready: bool = False
    params_verified: bool = False
    params_done_at: float | None = None
    """Wall-clock time (epoch s) the params were done here."""
    bench_clock_start: float | None = None
    """Epoch s when the manager's 45-minute benchmark clock started: its acknowledgement of
    ``/param-done`` (or its own ``param_done_at``, when earlier). None: not acknowledged yet."""
    bench: tuple[BenchRecord, ...] = ()
    verdict: Mapping[str, Any] | None = None
    """A terminal verdict (``{"exit_code", "reason", "at"}``): a failed bench, a killed instance,
    no plan that fits. A restart (Docker ``--restart always``, Kubernetes ``restartPolicy:
    Always``) only reports it again; nothing is registered or rerun."""
    failures: tuple[str, ...] = ()
    """The last :data:`MAX_FAILURES` failure reasons, oldest first."""
    outbox: tuple[Report, ...] = ()
    """Reports not yet acknowledged, in the order they are to be sent."""
    acked: tuple[Report, ...] = ()
    """The last few finished reports with their outcome, so a bench verdict acknowledged just
    before a crash is still known after the restart."""
    updated_at: str | None = None

    def with_failure(self, reason: str) -> SupervisorState:
        return dataclasses.replace(self, failures=(*self.failures, reason)[-MAX_FAILURES:])

    def with_bench(self, record: BenchRecord) -> SupervisorState:
        return dataclasses.replace(self, bench=(*self.bench, record)[-MAX_BENCH_RESULTS:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "phase": self.phase,
            "uuid": self.uuid,
            "runner_id": self.runner_id,
            "label": self.label,
            "plan": dict(self.plan) if self.plan is not None else None,
            "pce_ready": self.pce_ready,
            "params_verified": self.params_verified,
            "params_done_at": self.params_done_at,
            "bench_clock_start": self.bench_clock_start,
            "bench": [record.to_dict() for record in self.bench],
            "verdict": dict(self.verdict) if self.verdict is not None else None,
            "failures": list(self.failures),
            "outbox": [report.to_dict() for report in self.outbox],
            "acked": [report.to_dict() for report in self.acked],
            "updated_at": self.updated_at,
        }

    def to_json(self) -> str:
        # allow_nan=False: NaN is not JSON; better to fail the save than write an unreadable file.
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SupervisorState:
        """Parse and validate a document; raise :class:`StateFormatError` saying what is wrong."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise StateFormatError(f"not JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> SupervisorState:
        if not isinstance(data, dict):
            raise StateFormatError(f"top level is {type(data).__name__}, expected an object")
        version = data.get("version")
        if version != STATE_VERSION:
            raise StateFormatError(
                f"unknown version {version!r} (this build reads {STATE_VERSION})"
            )
        # Missing keys take their defaults (an older v1 writer); present keys must be well typed.
        # Unknown keys are ignored.
        d = Fields(data, "state")

        def each(key: str, parse: Callable[[Any, str], Any]) -> tuple[Any, ...]:
            return tuple(parse(item, f"{key}[{i}]") for i, item in enumerate(d.items(key)))

        return cls(
            phase=d.text("phase", required=True),
            uuid=d.opt_str("uuid"),
            runner_id=d.opt_int("runner_id"),
            label=d.opt_str("label"),
            plan=d.opt_obj("plan"),
            pce_ready=d.flag("pce_ready", False),
            params_verified=d.flag("params_verified", False),
            params_done_at=d.opt_float("params_done_at"),
            bench_clock_start=d.opt_float("bench_clock_start"),
            bench=each("bench", _bench_from),
            verdict=d.opt_obj("verdict"),
            failures=each("failures", str_item),
            outbox=each("outbox", _report_from),
            acked=each("acked", _report_from),
            updated_at=d.opt_str("updated_at"),
        )


def _bench_from(value: Any, where: str) -> BenchRecord:
    d = object_fields(value, where)
    return BenchRecord(
        rate=d.number("rate"),
        completed=d.integer("completed"),
        wall_s=d.number("wall_s"),
        plan=d.opt_obj("plan") or {},
        at=d.text("at", required=True),
        measurement=d.opt_obj("measurement") or {},
        bound=d.opt_obj("bound") or {},
    )


def _report_from(value: Any, where: str) -> Report:
    d = object_fields(value, where)
    try:
        return Report(
            kind=d.text("kind", required=True),
            uuid=d.text("uuid", required=True),
            rate=d.opt_float("rate"),
            id=d.text("id", required=True),
            created_at=d.text("created_at", required=True),
            outcome=d.opt_str("outcome"),
            passed=d.opt_bool("passed"),
            detail=d.text("detail"),
            finished_at=d.opt_str("finished_at"),
        )
    except StateFormatError:
        raise
    except ValueError as exc:
        raise StateFormatError(f"{where}: {exc}") from None
