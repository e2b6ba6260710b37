"""The rows of ``bench/fleet.py``: its plan and its run as values, and the table they make
(the figures themselves are ``_fleetfigures``'s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _fleet import Lifecycle, Recorder, VirtualMachine
from _fleetfigures import GROUPS, phase_cost, progress_gap_s
from _harness import Row, at_most, info

from cuzk_supervisor.sim import vtime

REPORT_PATHS = ("/param-done", "/bench-done")


@dataclass
class Plan:
    machines: int
    late: int
    loud: int
    deploy_s: float
    warm_s: float
    steady_s: float
    weather_s: float
    weather_share: float
    weather_pages: tuple[str, ...]
    recover_s: float
    life: Lifecycle
    loud_lines_per_s: float
    late_life: Lifecycle
    outage_s: float = 0.0
    throttle: float = 0.5
    throttle_s: float = 0.0
    retry_after: float = 30.0

    @property
    def cohorts(self) -> tuple[str, ...]:
        """The late cohorts, each ``late`` machines: one reports in each disturbance."""
        on = (("late", self.weather_s), ("outage", self.outage_s), ("throttle", self.throttle_s))
        return tuple(name for name, seconds in on if seconds > 0)


@dataclass
class Run:
    plan: Plan
    machines: list[VirtualMachine]
    recorder: Recorder
    clock: vtime.VirtualClock
    marks: dict[str, float] = field(default_factory=dict)
    opened: dict[str, list[int]] = field(default_factory=dict)  # connections opened, by mark
    counters: dict[str, Any] = field(default_factory=dict)
    unmatched: int = 0
    backlog: list[tuple[float, int, int]] = field(default_factory=list)  # t, lines, reports
    real_s: float = 0.0
    cpu_s: float = 0.0


# --- the figures --------------------------------------------------------------------------------


def rows_of(run: Run, quick: bool) -> list[Row]:
    plan, machines, requests = run.plan, run.machines, run.recorder.requests
    main = [m for m in machines if m.cohort == "main"]
    end = run.marks["end"]
    rows: list[Row] = []
    tag = f"N={plan.machines}"
    targets = {"params": (6.0, 20.0), "bench": (6.0, 20.0), "run": (1.5, 4.0)}
    costs = {}
    for group, phases in GROUPS.items():
        window = None
        if group == "run":
            window = (run.marks["steady_start"], run.marks["steady_end"])
        cost = costs[group] = phase_cost(group, main, requests, phases, end, window)
        req_t, kb_t = targets[group]
        rows += [
            at_most(f"{group}: requests/min per machine ({tag})", cost.per_min, "req/min", req_t),
            at_most(f"{group}: KB/min per machine, on the wire with TLS ({tag})",
                    cost.raw_kb_per_min, "KB/min", kb_t),
            info(f"{group}: KB/min per machine, HTTP bytes ({tag})", cost.plain_kb_per_min,
                 "KB/min"),
            at_most(f"{group}: busiest 1 s / the phase's average, over "
                    f"{cost.stretch_s:.0f} s ({tag})", cost.busiest_1s, "x", 3.0),
        ]  # fmt: skip
        if group != "run":
            # GET /status is the manager's whole table (about 290 B a row): its one read before
            # /bench-done (the dashboard-kill look-up) grows with the fleet; shown apart.
            rest = phase_cost(group, main, [r for r in requests if r.path != "/status"],
                              phases, end, window)  # fmt: skip
            name = f"{group}: KB/min per machine with TLS, without GET /status (the whole table)"
            rows.append(info(f"{name} ({tag})", rest.raw_kb_per_min, "KB/min"))
    rows.append(at_most(f"dashboard: longest wait between two log pushes before the run phase "
                        f"({tag})", progress_gap_s(main, requests), "s", 30.0))  # fmt: skip
    minutes = (run.marks["steady_end"] - run.marks["steady_start"]) / 60
    spans = zip(run.opened["steady_start"], run.opened["steady_end"], machines, strict=True)
    opened = sum(b - a for a, b, m in spans if m.cohort == "main")
    rows.append(at_most(f"run: new connections/min per machine ({tag})",
                        opened / len(main) / minutes, "conn/min", 0.2))  # fmt: skip
    loud = [m for m in main if m.index < plan.loud]
    if loud:
        for group in ("params", "bench"):
            cost = phase_cost(group, loud, requests, GROUPS[group], end)
            rows += [
                at_most(f"{group}, children at {plan.loud_lines_per_s:g} lines/s: requests/min "
                        f"per machine ({len(loud)} machines)", cost.per_min, "req/min", 6.0),
                at_most(f"{group}, children at {plan.loud_lines_per_s:g} lines/s: KB/min per "
                        f"machine with TLS ({len(loud)} machines)", cost.raw_kb_per_min,
                        "KB/min", 20.0),
            ]  # fmt: skip
    if "weather_start" in run.marks:
        rows += weather_rows(run, costs["run"].per_min)
    return rows


def steady_per_min(run: Run) -> float:
    """The run phase's requests a minute per machine in the steady window (the main cohort)."""
    main = [m for m in run.machines if m.cohort == "main"]
    window = (run.marks["steady_start"], run.marks["steady_end"])
    cost = phase_cost("run", main, run.recorder.requests, GROUPS["run"], run.marks["end"], window)
    return cost.per_min


def report_counts(
    run: Run, machines: list[VirtualMachine], running: tuple[str, ...]
) -> tuple[int, int, int]:
    """(reports expected, lost, applied twice) of ``machines`` by the manager's own counts:
    ``/param-done`` and ``/bench-done`` of each, ``/running`` too for the cohorts ``running``
    (lost only: it is a ping, sent again); a machine never registered loses one."""
    applied: dict[tuple[str, str], int] = {}
    for path in (*REPORT_PATHS, "/running"):
        for uuid, count in run.counters.get("reports", {}).get(path, {}).items():
            applied[(path, uuid)] = count
    expected = lost = twice = 0
    for m in machines:
        uuid = m.reporter.uuid
        if uuid is None:
            lost += 1
            continue
        paths = [*REPORT_PATHS, *(("/running",) if m.cohort in running else ())]
        for path in paths:
            expected += 1
            count = applied.get((path, uuid), 0)
            lost += count == 0
            twice += count > 1 and path in REPORT_PATHS
    return expected, lost, twice


def weather_rows(run: Run, steady_per_min: float) -> list[Row]:
    plan, machines, requests = run.plan, run.machines, run.recorder.requests
    w0, w1 = run.marks["weather_start"], run.marks["weather_end"]
    where = (f"{plan.weather_share:.0%} of the requests answered {'/'.join(plan.weather_pages)} "
             f"for {plan.weather_s / 60:g} min, N={plan.machines}")  # fmt: skip
    ended = sum(1 for m in machines if m.outcome.gone is not None)
    checked = [m for m in machines if m.cohort in ("main", "late")]
    expected, lost, twice = report_counts(run, checked, running=("late",))
    during = [r for r in requests if w0 <= r.start < w1]
    active = sum(1 for m in machines if m.cohort == "main" or (
        m.outcome.registered_at is not None and m.outcome.registered_at < w1))  # fmt: skip
    rate = len(during) / active / ((w1 - w0) / 60)
    told = sum(1 for m in machines if "manager.weather" in m.said)
    return [
        at_most(f"weather: instances ended ({where})", ended, "machines", 0),
        at_most(f"weather: reports lost ({where})", lost, "reports", 0),
        at_most(f"weather: reports applied twice ({where})", twice, "reports", 0),
        info(f"weather: reports of the late cohort and the fleet checked ({where})", expected,
             "reports"),
        at_most(f"weather: requests/min per machine over the steady rate ({where})",
                rate / steady_per_min if steady_per_min else None, "x", 2.0),
        info(f"weather: answers that were a proxy's page ({where})",
             sum(1 for r in during if r.status in (403, 404)), "req"),
        info(f"weather: machines that said manager.weather (a sustained episode) ({where})",
             told, "machines"),
    ]  # fmt: skip


def health_rows(run: Run) -> list[Row]:
    requests = run.recorder.requests
    latency = sorted(r.end - r.start for r in requests if r.status > 0)
    p99 = latency[int(0.99 * (len(latency) - 1))] if latency else None
    errors = sum(1 for m in run.machines if m.outcome.error)
    hours = len(run.machines) * (run.marks["end"] - run.marks["start"]) / 3600
    return [
        info("manager answer time p99 (the proxy and the manager in real time), s", p99, "s"),
        at_most("machines ended by an unexpected error", errors, "machines", 0),
        info("requests without their bytes on the wire matched (connections)", run.unmatched,
             "conn"),
        info("fleet process CPU per machine-hour simulated, s", run.cpu_s / hours, "s"),
        info("virtual time simulated, s", run.marks["end"] - run.marks["start"], "s"),
        info("virtual time that passed at the real rate (requests in flight), s",
             run.clock.real_waits_s, "s"),
    ]  # fmt: skip


def describe(run: Run) -> None:
    print(f"\n== {run.plan.machines} machines, {run.marks['end'] - run.marks['start']:.0f} s "
          f"simulated in {run.real_s:.0f} s real, {run.cpu_s:.0f} s CPU ==")  # fmt: skip
    outcomes = [
        (
            "error"
            if m.outcome.error
            else "gone"
            if m.outcome.gone
            else "running"
            if m.outcome.running_at
            else "not running"
        )
        for m in run.machines
    ]
    print("machines:", {k: outcomes.count(k) for k in sorted(set(outcomes))})
    for group, phases in GROUPS.items():  # where the bytes of each phase group went
        by_path: dict[str, list[int]] = {}
        for r in run.recorder.requests:
            if r.phase in phases:
                row = by_path.setdefault(f"{r.path} {r.status}", [0, 0, 0])
                row[0] += 1
                row[1] += r.bytes_in + r.bytes_out
                row[2] += r.raw or 0
        print(f"{group}: requests, HTTP bytes, bytes on the wire by path and status:", by_path)
    print("marks (s from start):", {k: round(v - run.marks["start"]) for k, v in
                                    run.marks.items()})  # fmt: skip
    if run.recorder.errors:
        print("transport errors:", run.recorder.errors)
    for m in [m for m in run.machines if m.outcome.error or m.outcome.gone][:3]:
        print(f"  machine {m.index}: {m.outcome.error or m.outcome.gone}")
