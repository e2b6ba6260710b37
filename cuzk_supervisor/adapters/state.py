"""The durable state file: one versioned JSON document that survives a container restart.

Rules (DESIGN.md principle 6, "durable before visible"):

- A save is atomic and durable: the document goes to a temp file in the same folder, the file is
  flushed and fsynced, ``os.replace`` puts it in place, then the folder is fsynced so the rename
  itself survives a power cut. A crash at any point leaves either the old file or the new one.
- A load never crashes the supervisor. A missing file is a fresh start; a file that cannot be
  read, is not JSON, has an unknown version or the wrong shape is moved aside
  (``<name>.corrupt-<timestamp>``, kept for a person to look at) with one warning event, and a
  fresh state is returned. Fresh is safe: params are verified again, the benchmark runs again,
  and registering again is idempotent per label at the manager.
- A failed write raises :class:`StateWriteError` (one line: the path and the OS error); the caller
  decides what follows.

:class:`SupervisorState` is a frozen value; change it with ``dataclasses.replace`` (or the small
``with_*`` helpers) and hand it to :class:`StateStore` or, in the event loop, to
:class:`StateKeeper`, which owns the current state and serialises writers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from cuzk_supervisor.adapters import files
from cuzk_supervisor.adapters.files import FileOps
from cuzk_supervisor.core.reports import (  # noqa: F401 (re-exported: plain data of the core)
    BENCH_DONE,
    OUTCOME_GONE,
    OUTCOME_OK,
    OUTCOME_REJECTED,
    PARAM_DONE,
    REPORT_KINDS,
    REPORT_OUTCOMES,
    RUNNING,
)
from cuzk_supervisor.errors import UsageError

log = structlog.get_logger("supervisor.state")

STATE_VERSION = 1
MAX_FAILURES = 20
"""Failure reasons kept (the most recent ones)."""
MAX_BENCH_RESULTS = 20
"""Benchmark results kept (the most recent ones)."""
MAX_STATE_BYTES = 16 * 1024 * 1024
"""A state file larger than this is not ours (a few kB in practice): moved aside unread."""


def utc_now_iso(clock: Callable[[], float] = time.time) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.000Z``."""
    stamp = datetime.fromtimestamp(clock(), tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


# --- the document ------------------------------------------------------------------------------


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "completed": self.completed,
            "wall_s": self.wall_s,
            "plan": dict(self.plan),
            "at": self.at,
            "measurement": dict(self.measurement),
        }


@dataclass(frozen=True, slots=True)
class Report:
    """One report to the manager, pending in the outbox or finished (``outcome`` set).

    ``id`` is stable across restarts: the lifecycle finds a report it queued before a crash by
    it (or by kind, :meth:`cuzk_supervisor.adapters.manager.Outbox.latest`).
    """

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
        return {
            "kind": self.kind,
            "uuid": self.uuid,
            "rate": self.rate,
            "id": self.id,
            "created_at": self.created_at,
            "outcome": self.outcome,
            "passed": self.passed,
            "detail": self.detail,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """Everything the supervisor must remember across a container restart.

    ``plan`` is opaque here (the policy module owns its shape); treat it as read-only.
    """

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
        d = _Fields(data, "state")
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
            bench=tuple(_bench_from(item, i) for i, item in enumerate(d.items("bench"))),
            verdict=d.opt_obj("verdict"),
            failures=tuple(
                _str_item(item, f"failures[{i}]") for i, item in enumerate(d.items("failures"))
            ),
            outbox=tuple(
                _report_from(item, f"outbox[{i}]") for i, item in enumerate(d.items("outbox"))
            ),
            acked=tuple(
                _report_from(item, f"acked[{i}]") for i, item in enumerate(d.items("acked"))
            ),
            updated_at=d.opt_str("updated_at"),
        )


class StateFormatError(ValueError):
    """The state document is not one this build can read (the message says why)."""


class _Fields:
    """Typed access to one JSON object's fields with error messages that name the field."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _bad(self, key: str, expected: str) -> StateFormatError:
        value = self.data.get(key)
        return StateFormatError(
            f"{self.where}.{key} is {type(value).__name__} {value!r:.60}, expected {expected}"
        )

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        if key not in self.data:
            if required:
                raise StateFormatError(f"{self.where}.{key} is missing")
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string or null")
        return value

    def opt_int(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._bad(key, "an integer or null")
        return value

    def opt_float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(key, "a number or null")
        return float(value)

    def number(self, key: str) -> float:
        value = self.opt_float(key)
        if value is None:
            raise self._bad(key, "a number")
        return value

    def integer(self, key: str) -> int:
        value = self.opt_int(key)
        if value is None:
            raise self._bad(key, "an integer")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def opt_bool(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, bool):
            raise self._bad(key, "true, false or null")
        return value

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            raise self._bad(key, "an object or null")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise self._bad(key, "a list")
        return value


def _str_item(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise StateFormatError(f"{where} is {type(value).__name__}, expected a string")
    return value


def _object(value: Any, where: str) -> _Fields:
    if not isinstance(value, dict):
        raise StateFormatError(f"{where} is {type(value).__name__}, expected an object")
    return _Fields(value, where)


def _bench_from(value: Any, index: int) -> BenchRecord:
    d = _object(value, f"bench[{index}]")
    return BenchRecord(
        rate=d.number("rate"),
        completed=d.integer("completed"),
        wall_s=d.number("wall_s"),
        plan=d.opt_obj("plan") or {},
        at=d.text("at", required=True),
        measurement=d.opt_obj("measurement") or {},
    )


def _report_from(value: Any, where: str) -> Report:
    d = _object(value, where)
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


# --- the file ----------------------------------------------------------------------------------


class StateFolderUnsafe(UsageError):
    """The state folder is world-writable and its mode cannot be fixed: refuse to start (exit 2).

    Anyone could plant a state file (a uuid, reports) or replace ours."""


class StateWriteError(Exception):
    """The state file could not be written; the message is one line naming the path and why."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.error = error
        why = f"[Errno {error.errno}] {error.strerror}" if error.errno else str(error)
        super().__init__(f"cannot write state file {path}: {why}")


@dataclass(frozen=True, slots=True)
class Loaded:
    """What :meth:`StateStore.load_detailed` found."""

    state: SupervisorState
    status: str
    """``loaded``, ``missing`` (fresh start) or ``recovered`` (a bad file was moved aside)."""
    problem: str | None = None
    moved_to: Path | None = None


class StateStore:
    """Load and save the state file at ``path``; see the module docstring for the rules.

    ``save`` is synchronous and thread-safe (one writer at a time); in the event loop use
    :class:`StateKeeper`, which runs it in a thread.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.ops = ops if ops is not None else FileOps()
        self.clock = clock
        self._lock = threading.Lock()

    def load(self) -> SupervisorState:
        return self.load_detailed().state

    def load_detailed(self) -> Loaded:
        """Read the state file; raise :class:`StateFolderUnsafe` when its folder is
        world-writable and cannot be fixed. Never blocks: a FIFO or device is moved aside."""
        self._check_folder()
        try:
            text = files.read_regular(self.path, MAX_STATE_BYTES).decode("utf-8")
        except FileNotFoundError:
            return Loaded(SupervisorState(), "missing")
        except (OSError, UnicodeDecodeError) as exc:
            return self._recover(f"unreadable: {exc}")
        try:
            state = SupervisorState.from_json(text)
        except StateFormatError as exc:
            return self._recover(str(exc))
        return Loaded(state, "loaded")

    def _check_folder(self) -> None:
        folder = self.path.parent
        try:
            if not files.world_writable(folder):
                return
        except OSError:
            return  # missing (the first save makes it, 0750) or unusable (the save says why)
        try:
            fixed = files.ensure_private_folder(folder)
        except OSError as exc:
            raise StateFolderUnsafe(
                f"state folder {folder} is world-writable and its mode cannot be fixed "
                f"({files.describe(exc)}): make it 0750 and owned by this user"
            ) from None
        if fixed:
            log.warning(
                "state.folder_mode_fixed",
                folder=str(folder),
                detail="the state folder was world-writable: the write bit for others is removed",
            )

    def _recover(self, problem: str) -> Loaded:
        stamp = datetime.fromtimestamp(self.clock(), tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        moved_to: Path | None = target
        move_error = None
        try:
            os.replace(self.path, target)
        except OSError as exc:
            # Never crash on load; the next save will say clearly if the folder is unwritable.
            moved_to, move_error = None, str(exc)
        log.warning(
            "state.corrupt",
            path=str(self.path),
            problem=problem,
            moved_to=str(moved_to) if moved_to else None,
            move_error=move_error,
            action="starting from a fresh state",
        )
        return Loaded(SupervisorState(), "recovered", problem, moved_to)

    def save(self, state: SupervisorState) -> SupervisorState:
        """Write ``state`` atomically and durably; return it with ``updated_at`` stamped.

        Raises :class:`StateWriteError` on any OS error; the old file is then untouched.
        """
        stamped = dataclasses.replace(state, updated_at=utc_now_iso(self.clock))
        data = stamped.to_json().encode("utf-8")
        with self._lock:
            try:
                self._write(data)
            except OSError as exc:
                raise StateWriteError(self.path, exc) from exc
        return stamped

    def _write(self, data: bytes) -> None:
        # A temp file in the same folder (os.replace is atomic only within one filesystem),
        # fsynced, renamed, then the folder fsynced: see files.atomic_write.
        files.atomic_write(self.path, data, files.PRIVATE_MODE, self.ops)


class StateKeeper:
    """Owns the current state in the event loop: one writer at a time, in call order.

    ``update`` applies a change to the latest state, saves it (in a thread: fsync can take
    milliseconds) and only then makes it current (durable before visible). Calls are applied in
    the order they were made (asyncio.Lock is FIFO), so concurrent writers never lose each
    other's changes as long as each change only touches its own fields.
    """

    def __init__(self, store: StateStore, state: SupervisorState | None = None) -> None:
        self.store = store
        self._state = state if state is not None else store.load()
        self._lock = asyncio.Lock()

    @property
    def state(self) -> SupervisorState:
        return self._state

    async def update(self, change: Callable[[SupervisorState], SupervisorState]) -> SupervisorState:
        """Apply ``change`` and save; raise :class:`StateWriteError` (state left unchanged)."""
        async with self._lock:
            new = change(self._state)
            self._state = await asyncio.to_thread(self.store.save, new)
            return self._state

    async def save_outbox(self, pending: Iterable[Report], acked: Iterable[Report]) -> None:
        """The outbox's save callback (:data:`cuzk_supervisor.adapters.manager.SaveOutbox`)."""
        pending_t, acked_t = tuple(pending), tuple(acked)
        await self.update(lambda s: dataclasses.replace(s, outbox=pending_t, acked=acked_t))
