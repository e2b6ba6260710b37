"""The terminal view of ``prove``: its wait for the daemon, its proofs, and its summary.

``prove`` has no phases: the live line says what it waits for, then which proof runs, for how
long, and its partitions done when the daemon's HTTP status lists them; each proof's result is
one line as it ends (the first to end is ``proof 1/N``); the closing summary gives the proofs and
both rates (``prove.summary``'s fields: ``cuzk_supervisor.cli.commands.provereport``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cuzk_supervisor.cli.viewtext import Action, Line, Status, duration

if TYPE_CHECKING:
    from cuzk_supervisor.cli.viewstate import ViewState


def _number(e: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = e.get(key)
    return float(value) if isinstance(value, int | float) else default


def prove_event(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """``prove.started``, ``.waiting``, ``.progress``: what it asked, its wait, how far it got."""
    name, now = e.get("event"), m.now or 0.0
    p = m.prove
    if name == "prove.started":
        m.prove = {"count": _number(e, "count"), "concurrency": _number(e, "concurrency", 1.0),
                   "waited_since": now, "deadline": _number(e, "ready_deadline_s")}  # fmt: skip
        m.waiting = f"asking the daemon at {e.get('address')}"
    elif name == "prove.waiting":
        p.update(waited_since=now - _number(e, "waited_s"), deadline=_number(e, "deadline_s"))
        m.waiting = f"waiting for the daemon at {e.get('address')} to answer"
    elif name == "prove.progress":
        # A result logged just before this snapshot was taken is counted already: keep the most.
        p.update(
            since=now - _number(e, "elapsed_s"),
            count=_number(e, "count", p.get("count", 0.0)),
            done=max(p.get("done", 0.0), _number(e, "done")),
            failed=max(p.get("failed", 0.0), _number(e, "failed")),
        )
        for key in ("proof_elapsed_s", "partitions_done", "partitions_total"):
            p.pop(key, None)
            if isinstance(e.get(key), int | float):
                p[key] = float(e[key])
        if e.get("eta_s") is not None:
            p.update(eta=_number(e, "eta_s"), at=now)
        m.waiting = ""
    return []


def daemon_ready(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """The proofs start now (the first ``prove.progress`` is 5 s away)."""
    m.prove.setdefault("since", m.now or 0.0)
    m.waiting = ""
    return []


def proof_result(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """``proof.completed`` or ``proof.failed``: one line, counted in the order proofs end."""
    p = m.prove
    ok = e.get("event") == "proof.completed"
    p["ended"] = p.get("ended", 0.0) + 1
    key = "done" if ok else "failed"
    p[key] = p.get(key, 0.0) + 1
    count = int(p.get("count") or p["ended"])
    parts: list[str] = []
    if ok:
        total_ms = _number(e, "total_ms")
        parts.append(f"ok, daemon time {duration(total_ms / 1000)}" if total_ms else "ok")
    else:
        parts.append(f"{e.get('status', 'failed')}: {e.get('error') or 'no reason given'}")
    submissions = int(_number(e, "submissions", 1))
    if submissions > 1:
        parts.append(f"{submissions} submissions")
    if e.get("uploads_cut"):
        parts.append(f"{e.get('uploads_cut')} uploads cut")
    if e.get("job_id"):
        parts.append(f"job {e.get('job_id')}")
    took = e.get("wall_s")
    return [
        Line(
            "phase",
            ", ".join(parts),
            phase=f"proof {int(p['ended'])}/{count}",
            mark="done" if ok else "failed",
            took_s=float(took) if isinstance(took, int | float) else None,
        )
    ]


def prove_summary(m: ViewState, e: Mapping[str, Any]) -> list[Action]:
    """``prove.summary``: kept for the closing lines."""
    m.summary = dict(e)
    return []


def prove_status(m: ViewState) -> Status | None:
    """The live line: the wait for the daemon, then the proofs; nothing once the summary is in."""
    p = m.prove
    if m.summary:
        return None
    if "since" not in p:  # not proving yet: connecting, waiting for the daemon
        return Status("prove", m.waiting or "starting", since=p.get("waited_since", m.started),
                      expected_s=p.get("deadline") or None, expected_is_limit=True)  # fmt: skip
    count, done, failed = int(p.get("count", 0)), int(p.get("done", 0)), int(p.get("failed", 0))
    # The next proof starts as one ends: up to ``concurrency`` of those not ended yet run.
    ended = int(p.get("ended", 0))
    running = max(1, min(int(p.get("concurrency", 1)), count - ended)) if count else 1
    if count and ended >= count:
        text = "every proof ended"
    elif running > 1:
        text = f"{running} proofs running"
    else:
        text = f"proof {min(ended + 1, count)}/{count} running" if count else "proof running"
        if count > 1 and "proof_elapsed_s" in p:
            text += f" {duration(p['proof_elapsed_s'])}"
    if "partitions_total" in p:
        text += f", partitions {int(p['partitions_done'])}/{int(p['partitions_total'])}"
    if failed:
        text += f", {failed} failed"
    if count > 1:  # a bar of proofs done, with an ETA; one proof: its elapsed time alone
        return Status("prove", text, since=p["since"], done=float(done), total=float(count),
                      unit="proofs", eta_s=p.get("eta"), eta_at=p.get("at"))  # fmt: skip
    return Status("prove", text, since=p["since"])


def prove_closing(m: ViewState) -> list[Line]:
    """The summary's lines: the proofs, the rate in wall time and in daemon time."""
    s = m.summary
    if not s:
        return []
    completed, failed = int(_number(s, "completed")), int(_number(s, "failed"))
    proofs = f"{completed} completed, {failed} failed (concurrency {s.get('concurrency')}"
    proofs += f", {s.get('submissions')} submissions"
    if s.get("uploads_cut"):
        proofs += f", {s.get('uploads_cut')} uploads cut"
    lines = [Line("summary", proofs + ")", label="proofs")]
    wall = f"{_number(s, 'proofs_per_hour'):.1f} proofs/hour in wall time "
    wall += f"({completed} in {duration(_number(s, 'wall_s'))})"
    lines.append(Line("summary", wall, label="rate"))
    if isinstance(s.get("daemon_proofs_per_hour"), int | float):
        daemon = (
            f"{_number(s, 'daemon_proofs_per_hour'):.1f} proofs/hour in daemon time "
            f"({duration(_number(s, 'daemon_wall_s'))} of daemon time, "
            f"x{_number(s, 'daemon_seconds_per_second'):.2f} the wall clock)"
        )
    else:
        daemon = "daemon time unknown (no completed proof gave its total_ms)"
    lines.append(Line("summary", daemon, label=""))
    bound = s.get("bound")
    if isinstance(bound, Mapping) and bound.get("bound"):
        lines.append(Line("summary", f"{bound['bound']}: {bound.get('reason', '')}", label="bound"))
    return lines
