"""What the manager already knows of a report this process did not see answered (pure).

A report is written to the outbox before it is sent and removed after the answer is recorded. A
crash between the manager applying it and our recording the answer leaves it queued, and the next
process would send it again. That is safe but not free: ``/bench-done`` does not check the state,
so a resend revives a killed instance to ``bench_done`` in the manager's records, and every resend
shows twice in its history. So a report found queued at start is first looked up in the manager's
``GET /status`` record of this instance; only what the record does not show is sent again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_GONE, OUTCOME_OK, PARAM_DONE

# Manager instance states (docs/manager-api.md, "States, timeouts and kills").
KILLED = "killed"
PAST_PARAMS = frozenset({"params_done", "bench_done", "running"})
PAST_BENCH = frozenset({"bench_done", "running"})

RECONCILED_KINDS = frozenset({PARAM_DONE, BENCH_DONE})
"""Kinds worth a lookup. ``/running`` is a repeated liveness ping: sending it again is its job."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class Queued(Protocol):
    """What the decision needs of a queued report (``adapters.state.doc.Report`` has it)."""

    @property
    def kind(self) -> str: ...

    @property
    def rate(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Recorded:
    """How the manager's records show a queued report ended: the ``outcome``, ``passed`` and
    ``detail`` its ``Report`` is finished with (the caller stamps the time)."""

    outcome: str
    detail: str
    passed: bool | None = None


def recorded_outcome(report: Queued, record: Mapping[str, Any] | None) -> Recorded | None:
    """How ``report`` finished as the manager's ``record`` of the instance shows it, or None when
    the record does not show it applied (then it must be sent). ``record`` is None when the
    manager does not list the instance: sending tells (a 404 makes it gone)."""
    if record is None or report.kind not in RECONCILED_KINDS:
        return None
    state = record.get("state")
    if state == KILLED:
        min_rate = _number(record.get("min_rate"))
        failing = min_rate is not None and report.rate is not None and report.rate < min_rate
        if report.kind == BENCH_DONE and failing:
            # The verdict it got, or would get: fail. The manager has acted on it already.
            return Recorded(OUTCOME_OK, "verdict read from status", passed=False)
        reason = record.get("kill_reason") or "no reason given"
        return Recorded(OUTCOME_GONE, f"instance killed: {reason}")
    if report.kind == PARAM_DONE and (state in PAST_PARAMS or record.get("param_done_at")):
        return Recorded(OUTCOME_OK, "already recorded by the manager")
    if report.kind == BENCH_DONE and state in PAST_BENCH:
        rate = _number(record.get("bench_rate"))
        if rate is not None and report.rate is not None and math.isclose(rate, report.rate):
            return Recorded(OUTCOME_OK, "already recorded by the manager", passed=True)
    return None


def find_record(listing: Any, uuid: str) -> Mapping[str, Any] | None:
    """This instance's entry in a ``GET /status`` answer (a list of records), if any."""
    if not isinstance(listing, list):
        raise ValueError(f"GET /status answered {type(listing).__name__}, not a list")
    for record in listing:
        if isinstance(record, dict) and record.get("uuid") == uuid:
            return record
    return None


def listing_problem(listing: Any) -> str | None:
    """Why a ``GET /status`` answer, asked by a registered instance, cannot be the manager's
    (None: it can be). The manager lists every instance it knows and keeps killed rows for 7
    days, so an instance that registered is in its table: an empty list is a proxy's cache, a
    maintenance page or a manager restarted on an empty database, never its word on us. Such an
    answer is a bad answer (retried and counted), not evidence of a kill."""
    if not isinstance(listing, list):
        return f"not a list but {type(listing).__name__}"
    if not listing:
        return "an empty list, though this instance registered"
    return None


def gone_reason(record: Mapping[str, Any] | None) -> str | None:
    """Why the manager's ``record`` of this instance says it is finished, or None. A kill is
    concluded only from positive evidence (docs/architecture.md, rule 7): the record in state
    ``killed``. A record missing from one listing (``record`` None) is NOT evidence: a proxy, a
    cache or a manager restarted on an empty database say that too, while the real manager may still
    hold us as ``params_done`` and time us out if we stop. Whether the manager still knows us is
    learnt from a call about this uuid (a 404 "instance not found" on a report:
    ``InstanceGone``)."""
    if record is not None and record.get("state") == KILLED:
        return f"killed by the manager: {record.get('kill_reason') or 'no reason given'}"
    return None


_MANAGER_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f")


def manager_time(value: Any) -> float | None:
    """Epoch seconds of a timestamp in a ``GET /status`` record (the real manager writes
    ``YYYY-MM-DD HH:MM:SS`` in UTC; ISO-8601 with ``T``, ``Z`` or an offset is read too; a
    number is taken as epoch seconds). None when it is missing or unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value > 0 else None
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    stamp = _parse_stamp(text[:-1] + "+00:00" if text.endswith("Z") else text)
    if stamp is None:
        return None
    return (stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)).timestamp()


def _parse_stamp(text: str) -> datetime | None:
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(text)
    for fmt in _MANAGER_TIME_FORMATS:
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, fmt)
    return None
