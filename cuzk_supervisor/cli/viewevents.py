"""The terminal view's handlers: one per event it turns into more than a generic line.

Each takes the :class:`~cuzk_supervisor.cli.viewstate.ViewState` and the event, updates the
state and returns the lines to print (the live line is worked out by the view after every
event). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cuzk_supervisor.cli.viewprove import daemon_ready, proof_result, prove_event, prove_summary
from cuzk_supervisor.cli.viewtext import (
    Action,
    Line,
    PhaseState,
    describe,
    duration,
    plan_head,
    short,
    size,
)

if TYPE_CHECKING:
    from cuzk_supervisor.cli.viewstate import ViewState

Handler = Callable[["ViewState", Mapping[str, Any]], list[Action]]

UNJUDGED = " (not judged: no manager)"  # a local run's rate: nobody held it to a min_rate


def _phase_entered(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    out: list[Action] = []
    if m.phase is not None:
        out.append(m.phase_line(m.now, mark="done"))
    name = str(e.get("phase", ""))
    m.phase = PhaseState(name, m.now)
    m.last_phase = name
    warm, full = m.plan_workers
    m.workers = (warm if name == "warmup" else full if name in _FULL else 0) or m.workers
    m.waiting, m.repeats = "", 0
    m.seen = {key for key in m.seen if key[0] == "manager.register_waiting"}
    if name == "run":
        words = f"proving at {m.workers} workers" if m.workers else "proving"
        out.append(Line("phase", f"{words}; the daemon is kept up", phase="run", mark="running"))
    return out


_FULL = frozenset({"restart", "settle", "bench", "run"})


def _registered(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    return m.note(f"runner {e.get('runner_id')}, instance {e.get('uuid')}")


def _skipped(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if e.get("call") == "register":
        return m.note("local run: no manager URL, nothing is reported")
    if e.get("call") == "bench_done":
        m.verdict = UNJUDGED
    return []


def _register_waiting(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """The wait in the live line; the manager client's ``manager.away`` warnings say it."""
    m.waiting = f"{e.get('url') or 'the manager'} did not answer ({e.get('reason', '')})"
    if e.get("level") not in ("warning", "error"):
        return []
    return m.problem(e, f"manager at {e.get('url')} did not answer: {e.get('reason', '')}")


def _fetch_started(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.fetch = {"total": float(e.get("total_bytes") or 0), "done": 0.0}
    return []


def _fetch_progress(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.fetch.update(
        done=float(e.get("done_bytes") or 0), total=float(e.get("total_bytes") or 0),
        rate=float(e.get("rate_bytes_s") or 0), at=m.now or 0.0,
    )  # fmt: skip
    if e.get("eta_s") is not None:
        m.fetch["eta"] = float(e["eta_s"])
    if e.get("event") == "params.fetched":
        took = f" in {duration(e.get('elapsed_s'))}" if e.get("elapsed_s") is not None else ""
        rate = f" ({m.fetch_rate()})" if m.fetch_rate() else ""
        return m.note(f"{size(e.get('done_bytes'))} fetched{took}{rate}")
    return []


def _plan_made(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.plan_workers = (int(e.get("warmup_workers") or 0), int(e.get("full_workers") or 0))
    gpus = re.search(r"(\d+) GPU", str(e.get("summary", "")))
    if e.get("full_workers") is not None and e.get("total_budget_gib") is not None:
        m.plan = (f"{e['full_workers']} workers (warmup {e.get('warmup_workers')}), daemon "
                  f"memory budget {e['total_budget_gib']} GiB"
                  + (f", {gpus.group(1)} GPU(s)" if gpus else ""))  # fmt: skip
    else:
        m.plan = plan_head(e.get("summary"))
    return m.note(m.plan)


def _step_down(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    text = (f"stepped down to {e.get('full_workers')} workers (warmup "
            f"{e.get('warmup_workers')}): {e.get('cause', '')}")  # fmt: skip
    return [Line("warning", text)]


def _one_proof(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.workers = int(e.get("workers") or 0) or m.workers
    return m.note(f"1 proof in {duration(e.get('wall_s'))} at {e.get('workers')} workers")


def _replaced(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.workers = int(e.get("workers") or 0) or m.workers
    return []


def _daemon_ready(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if m.options.command == "prove":
        return daemon_ready(m, e)
    if "startup_s" not in e or m.phase is None or m.phase.name != "restart":
        return []
    return m.note(f"daemon ready at {m.workers} workers in {duration(e.get('startup_s'))}")


def _proof(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if m.options.command == "prove":
        return proof_result(m, e)
    if e.get("event") == "proof.completed":
        if m.phase is not None and m.phase.name == "bench":
            m.bench["done"] = m.bench.get("done", 0) + 1
        return []
    return _said("proof {status}: {error}")(m, e)


def _bench_started(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.bench = {"planned": float(e.get("max_proofs") or 0), "done": 0.0}
    return []


def _status(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if e.get("headroom_gib") is not None:
        m.headroom = f"{float(e['headroom_gib']):.1f} GiB memory headroom ({e.get('risk', '?')})"
    if "bench_done" in e:
        m.bench.update(planned=float(e.get("bench_planned") or m.bench.get("planned", 0)))
        if e.get("rate_so_far") is not None:
            m.bench["rate"] = float(e["rate_so_far"])
        if e.get("eta_s") is not None:
            m.bench.update(eta=float(e["eta_s"]), at=m.now or 0.0)
    return []


def _stretch_done(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if m.phase is not None and m.phase.mark == "stopped":
        return []  # interrupted: its note says how
    return m.note(f"{e.get('completed')} of {e.get('submitted')} proofs done ({e.get('stopped')})")


def _interrupted(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if m.phase is not None:
        m.phase.mark = "stopped"
    lost = f", {e.get('lost')} in flight lost" if e.get("lost") else ""
    return m.note(f"interrupted after {e.get('completed')} proofs{lost}")


def _keeper(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """``daemon.`` or ``worker.`` ``restart_scheduled``, ``crash_loop``, ``start_failed``: the
    events of a kept process (a worker command's name in its ``worker`` field)."""
    kind, _, what = str(e.get("event", "")).partition(".")
    who = e.get("worker") or kind
    if what == "restart_scheduled":
        return [Line("warning", f"{who} restarts in {duration(e.get('delay_s'))} "
                                f"(attempt {e.get('attempt')})")]  # fmt: skip
    if what == "crash_loop":
        return m.problem(e, f"{who} crash loop: {e.get('verdict', '')}")
    return m.problem(e, f"{who} failed to start: {e.get('exit_reason', '')}")


def _daemon_exited(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if e.get("level") not in ("warning", "error"):
        return []
    return m.problem(e, f"daemon {e.get('exit_kind')}: {e.get('exit_reason', '')}")


def _bench_result(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.rate = float(e.get("rate") or 0)
    how = e.get("measurement")
    reason = how.get("reason") if isinstance(how, Mapping) else ""
    if isinstance(how, Mapping) and "proofs" in how:
        uncertainty = how.get("uncertainty_pct")
        spread = f"±{uncertainty:.1f} %, " if isinstance(uncertainty, int | float) else ""
        stopped = f", stopped: {how['stopped']}" if how.get("stopped") else ""
        m.measured = f"{spread}{how.get('proofs', 0)} bench proofs{stopped}"
    bound = e.get("bound")
    if isinstance(bound, Mapping) and bound.get("bound"):
        m.bound = f"{bound['bound']}: {bound.get('reason', '')}"
    return m.note(f"{m.rate:.1f} proofs/hour" + (f" ({reason})" if reason else ""))


def _verdict(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    if e.get("event") == "bench.failed" or e.get("passed") is False:
        m.verdict = f" - failed: below min_rate {m.options.min_rate:g}"
        if m.failure:  # a rate 0 sent for a failure already shown
            return []
        reason = f"{float(e.get('rate') or 0):.1f} proofs/hour is below min_rate"
        out = m.fail(reason)
        m.failure = ""  # the rate line says it
        return out
    if not m.verdict:
        m.verdict = f" - passed (min_rate {m.options.min_rate:g})"
    if m.phase is not None and m.rate is not None:
        m.phase.note = f"{m.rate:.1f} proofs/hour{m.verdict}"
    return []


def _unjudged(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """A local run's rate: measured, judged by nobody; never "passed"."""
    m.verdict = UNJUDGED
    if m.rate is None:  # bench.result said it first, in the same units
        m.rate = float(e.get("rate") or 0)
    if m.phase is not None:
        m.phase.note = f"{m.rate:.1f} proofs/hour{m.verdict}"
    return []


def _failed(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    return m.fail(str(e.get("reason") or e.get("event")))


def _gone(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    return m.fail(f"the manager killed this instance: {e.get('reason', '')}")


def _health(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """The run phase's health watch: a change of its findings, a restart, the manager told."""
    kind = {"info": "note", "warning": "warning"}.get(str(e.get("level")), "error")
    words = "telling the manager" if e.get("event") == "health.telling_manager" else "health"
    return [Line(kind, f"{words}: {e.get('reason', '')}")]


def _finished(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    m.failure = f"an earlier run ended with exit {e.get('exit_code')}: {e.get('reason', '')}"
    return [Line("warning", f"{m.failure} ({e.get('detail', '')})")]


def _stopping(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    return [Line("note", f"stopping on {e.get('signal')}")]


def _ignore(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    return []


def _weather_over(e: Mapping[str, Any]) -> str:
    return f"the manager's own answers are back after {e.get('minutes')} min of a proxy's pages"


def _said(template: str) -> Any:
    """A warning or error in words: ``template`` formatted with the event's fields."""

    def handler(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
        try:
            text = template.format_map(_Blank(e))
        except (ValueError, IndexError):
            text = describe(e)
        return m.problem(e, text)

    return handler


class _Blank(dict[str, Any]):
    """An event's fields for ``str.format_map``: lists as ``1, 2``; a missing field as ``?``."""

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        return short(value) or value if isinstance(value, list | tuple) else value

    def __missing__(self, key: str) -> str:
        return "?"


HANDLERS: dict[str, Handler] = {
    "phase.entered": _phase_entered,
    "manager.registered": _registered,
    "manager.report_skipped": _skipped,
    "manager.register_waiting": _register_waiting,
    "params.fetch_started": _fetch_started,
    "params.progress": _fetch_progress,
    "params.fetched": _fetch_progress,
    "params.present": lambda m, e: m.note(f"{e.get('files')} files present"),
    "params.already_verified": lambda m, e: m.note("already verified"),
    "params.no_fetch": lambda m, e: m.note("nothing to fetch"),
    "params.lock_wait": _said("waiting up to {wait_s}s for the params lock: {reason}"),
    "params.lock_holders_stopped": _said("stopped pids {pids} holding the params lock: {reason}"),
    "plan.made": _plan_made,
    "plan.step_down": _step_down,
    "warmup.done": _one_proof,
    "settle.done": _one_proof,
    "daemon.replaced": _replaced,
    "daemon.ready": _daemon_ready,
    "proof.submitted": _ignore,
    "proof.completed": _proof,
    "proof.failed": _proof,
    "bench.started": _bench_started,
    "supervisor.status": _status,
    "bench.stretch_done": _stretch_done,
    "bench.result": _bench_result,
    "manager.bench_verdict": _verdict,
    "bench.passed": _verdict,
    "bench.failed": _verdict,
    "bench.unjudged": _unjudged,
    "lifecycle.failed": _failed,
    "manager.instance_gone": _gone,
    "lifecycle.finished": _finished,
    "supervisor.stopping": _stopping,
    "prove.started": prove_event,
    "prove.waiting": prove_event,
    "prove.progress": prove_event,
    "prove.summary": prove_summary,
    "manager.report_queued": _ignore,
    "manager.report_done": _ignore,
    "bench.interrupted": _interrupted,
    "daemon.exited": _daemon_exited,
    "health.changed": _health,
    "health.restart": _health,
    "health.telling_manager": _health,
    "proof.attempt_failed": _ignore,  # proof.failed said it
    "proof.daemon_restarted": _ignore,  # daemon.exited said it; the proof is sent again
    "bench.no_time_to_measure_again": _said(
        "no time left in the bench budget to measure again ({stretches} tries)"
    ),
    "manager.unavailable": _said("manager at {url} did not answer {call}: {reason}"),
    # One outage, a few lines (adapters/manager/away.py): its start, a summary a minute.
    "manager.away": _said("manager at {url} did not answer {call}: {reason}"),
    "manager.still_away": _said(
        "manager at {url} still away after {away_s}s: {failed} more failed requests ({reason})"
    ),
    # A proxy's weather (adapters/manager/away.py): never a kill; one line when it lasts.
    "manager.weather": _said(
        "for {minutes} min the manager's URL has answered with pages that are not the "
        "manager's ({answers} answers, the last {last}): nothing is ended by them, reports are "
        "kept and retried"
    ),
    "manager.weather_over": lambda m, e: [Line("info", _weather_over(e))],
    "memory.risk_changed": _said("memory risk changed (was {previous}): {reason}"),
    "memory.risk_critical": _said("memory critical: {reason}"),
    "pid1.tree_killed": _said("processes left at the end needed SIGKILL: pids {killed}"),
    "daemon.restart_scheduled": _keeper,
    "daemon.crash_loop": _keeper,
    "daemon.start_failed": _keeper,
    "worker.restart_scheduled": _keeper,
    "worker.crash_loop": _keeper,
    "worker.start_failed": _keeper,
}
