"""The manager's outage and its 429s in ``bench/fleet.py``, on the same virtual clock as the
weather (issue 22's two scenarios, lost in the move to virtual time and back with issue 44).

- **outage**: the manager's host is gone for ``--outage-s`` (the TLS front refuses every
  connection and cuts the open ones: ``_tlsproxy``'s ``/outage``), while a cohort (``--late``
  of the fleet) registers just before it and has its ``/param-done`` and ``/bench-done`` due
  in it. After it: the busiest 10 s of requests against the whole fleet's steady rate (at most
  3x), the fleet's backlog (log lines waiting, reports pending) back to its steady size (within
  600 s), no report lost, none applied twice.
- **429**: for ``--throttle-s`` the manager answers ``--throttle`` of the requests 429 with
  ``Retry-After: --retry-after`` while another cohort registers and reports: every machine of it
  reaches its verdict, no report is lost, and no machine asks again before the ``Retry-After``
  it was given (``_fleet.CountingTransport`` notes a request made before it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from _fleet import VirtualMachine
from _fleetrows import Run, report_counts
from _harness import Row, at_most, info

from cuzk_supervisor.sim import vtime

SAMPLE_EVERY_S = 10.0
"""How often the fleet's backlog is summed (virtual seconds): 2,000 machines' shippers and
outboxes a time."""
RECOVERY_WATCH_S = 900.0
"""How long after the outage the backlog is watched for its drain (the target is 600 s)."""


async def sample_backlog(run: Run, stop: asyncio.Event) -> None:
    """The fleet's backlog every ``SAMPLE_EVERY_S``: (time, log lines waiting, reports pending)."""
    while not stop.is_set():
        lines = sum(m.shipper.stats().buffered_lines for m in run.machines)
        reports = sum(len(m.reporter.outbox.pending) for m in run.machines)
        run.backlog.append((run.clock.monotonic(), lines, reports))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def until(clock: vtime.VirtualClock, predicate: Any, deadline: float) -> bool:
    """Whether ``predicate`` came true before ``deadline`` (looked at every 5 virtual s)."""
    while not predicate():
        if clock.monotonic() >= deadline:
            return False
        await asyncio.sleep(5.0)
    return True


async def outage(run: Run, control: Any, launch: Callable[[str, float], None]) -> None:
    """The manager's host gone for ``outage_s`` (``control.outage``: fleet.py's, at the TLS
    front); a cohort registered just before it (``launch``) has its reports due in it; then
    the recovery, watched until the backlog drained (or ``RECOVERY_WATCH_S``) and for
    ``recover_s`` at least."""
    plan, clock = run.plan, run.clock
    launch("outage", clock.monotonic())  # registered within 30 s, its reports 90 s on and more
    await asyncio.sleep(45.0)
    await control.outage(True)
    run.marks["outage_start"] = clock.monotonic()
    await asyncio.sleep(plan.outage_s)
    await control.outage(False)
    o1 = run.marks["outage_end"] = clock.monotonic()
    await until(clock, lambda: drained_at(run) is not None, o1 + RECOVERY_WATCH_S)
    await asyncio.sleep(max(0.0, o1 + plan.recover_s - clock.monotonic()))
    run.marks["outage_watched"] = clock.monotonic()


def drained_at(run: Run) -> float | None:
    """When the backlog, after the outage, was back to its steady size: no more log lines
    waiting than the most in the steady window, no report pending."""
    s0, s1 = run.marks["steady_start"], run.marks["steady_end"]
    limit = max((lines for t, lines, _ in run.backlog if s0 <= t < s1), default=0)
    after = run.marks["outage_end"]
    for t, lines, reports in run.backlog:
        if t >= after and lines <= limit and reports == 0:
            return t
    return None


def busiest_10s_per_s(times: Sequence[float], t0: float, t1: float) -> float:
    """The most requests a second over any 10 s in ``[t0, t1)`` (1-s buckets)."""
    n = max(1, int(t1 - t0))
    counts = [0] * n
    for t in times:
        k = int(t - t0)
        if 0 <= k < n:
            counts[k] += 1
    return max(sum(counts[i : i + 10]) for i in range(max(1, n - 9))) / 10


def _cohort(run: Run, name: str) -> list[VirtualMachine]:
    return [m for m in run.machines if m.cohort == name]


def outage_rows(run: Run, steady_per_min: float) -> list[Row]:
    plan, requests = run.plan, run.recorder.requests
    o0, o1, end = run.marks["outage_start"], run.marks["outage_end"], run.marks["outage_watched"]
    where = f"after a {plan.outage_s / 60:g}-min outage, N={plan.machines}"
    active = [m for m in run.machines if m.outcome.registered_at is not None
              and m.outcome.registered_at < o1]  # fmt: skip
    steady = steady_per_min / 60 * len(active)
    answered = [r.start for r in requests if o1 <= r.start < end and r.status > 0]
    busiest = busiest_10s_per_s(answered, o1, end)
    drained = drained_at(run)
    checked = [m for m in run.machines if m.cohort in ("main", "late", "outage")]
    expected, lost, twice = report_counts(run, checked, running=())
    name = f"outage: backlog drained ({where})"
    drain_row = (
        at_most(name, drained - o1, "s", 600.0)
        if drained is not None
        else Row(f"{name} [not within {end - o1:.0f} s]", end - o1, "s", "<= 600", False)
    )
    return [
        info(f"outage: whole fleet's steady request rate ({len(active)} machines)", steady,
             "req/s"),
        info(f"outage: busiest 10 s after it, requests/s ({where})", busiest, "req/s"),
        at_most(f"outage: busiest 10 s / the steady rate ({where})",
                busiest / steady if steady else None, "x", 3.0),
        drain_row,
        at_most(f"outage: reports lost ({where})", lost, "reports", 0),
        at_most(f"outage: reports applied twice ({where})", twice, "reports", 0),
        info(f"outage: reports of the cohort due in it and the fleet checked ({where})",
             expected, "reports"),
        info(f"outage: requests unanswered during it ({where})",
             sum(1 for r in requests if o0 <= r.start < o1 and r.status == 0), "req"),
    ]  # fmt: skip


def throttle_rows(run: Run) -> list[Row]:
    plan, requests = run.plan, run.recorder.requests
    t0, t1 = run.marks["throttle_start"], run.marks["throttle_end"]
    where = (f"{plan.throttle:.0%} answered 429 Retry-After {plan.retry_after:g} s for "
             f"{plan.throttle_s / 60:g} min, N={plan.machines}")  # fmt: skip
    cohort = _cohort(run, "throttle")
    verdicts = sum(1 for m in cohort if m.outcome.verdict is not None)
    expected, lost, twice = report_counts(run, cohort, running=())
    return [
        at_most(f"429: verdicts not reached by the cohort reporting in it ({where})",
                len(cohort) - verdicts, "machines", 0),
        at_most(f"429: requests made before their Retry-After ({where})",
                sum(1 for r in requests if r.early), "req", 0),
        at_most(f"429: reports lost ({where})", lost, "reports", 0),
        at_most(f"429: reports applied twice ({where})", twice, "reports", 0),
        info(f"429: reports of the cohort checked ({where})", expected, "reports"),
        info(f"429: answers 429 received ({where})",
             sum(1 for r in requests if r.status == 429 and t0 <= r.start), "req"),
        info(f"429: requests during it ({where})",
             sum(1 for r in requests if t0 <= r.start < t1), "req"),
    ]  # fmt: skip
