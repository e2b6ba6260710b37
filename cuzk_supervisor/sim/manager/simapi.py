"""The simulated manager's own endpoints, not part of the real API, for tests and demos
(never faulted, plain JSON): ``/sim/kill`` (any reason), ``/sim/sweep`` (one sweep now),
``/sim/requests`` (the journal), ``/sim/manager-log``, ``/sim/counters``, ``/sim/faults`` (read
and switch the faults, refuse connections for a while) and ``/sim/state``.
"""

from __future__ import annotations

from typing import Any

from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.faults import FaultError, validate
from cuzk_supervisor.sim.manager.gojson import BadJSON, decode_struct
from cuzk_supervisor.sim.manager.platform import vast_id_from_label
from cuzk_supervisor.sim.manager.wire import (
    Request,
    Response,
    decode_json,
    go_atoi_positive,
    sim_response,
)


def h_sim_kill(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "SimKillReq", {"uuid": str, "reason": str})
    inst = app.store.kill(data.get("uuid", ""), data.get("reason", "") or "manual kill")
    if inst is None:
        return sim_response(404, {"error": "instance not found"})
    app.killed(inst, "operator", vast_id_from_label(inst.label) is not None)
    return sim_response(200, {"ok": True, "instance": inst.to_json()})


def h_sim_sweep(app: App, req: Request) -> Response:
    kills = app.monitor.sweep()
    return sim_response(
        200,
        {
            "kills": [
                {**k.instance.to_json(), "cause": k.cause, "destroyed": k.destroyed} for k in kills
            ],
            "sweeps": app.monitor.sweeps(),
        },
    )


def h_sim_requests(app: App, req: Request) -> Response:
    since_text = req.param("since")
    since = int(since_text) if since_text.isdigit() else 0
    entries = app.journal.entries(
        since=since,
        path=req.param("path") or None,
        include_sim=req.param("sim") in ("1", "true", "yes"),
    )
    return sim_response(200, [e.to_json() for e in entries])


def h_sim_manager_log(app: App, req: Request) -> Response:
    tail = go_atoi_positive(req.param("tail"), 0)
    return sim_response(200, [line.to_json() for line in app.manager_log.lines(tail)])


def h_sim_counters(app: App, req: Request) -> Response:
    return sim_response(200, counters_view(app, reports=req.param("reports") in ("1", "true")))


def counters_view(app: App, *, reports: bool = False) -> dict[str, Any]:
    """What ``GET /sim/counters`` answers (the benchmark's and the tests' in-process view)."""
    view = app.counters.snapshot(reports=reports)
    view["manager_log"] = app.manager_log.totals()
    view["instance_logs"] = app.logs.totals()
    return view


def h_sim_faults_get(app: App, req: Request) -> Response:
    return sim_response(200, _faults_view(app))


def _faults_view(app: App) -> dict[str, Any]:
    view = app.faults.settings.to_json()
    view["refusing"] = app.listener is not None and not app.listener.listening
    view["throttle_left"] = app.faults.throttle_left
    return view


def h_sim_faults_post(app: App, req: Request) -> Response:
    try:
        raw = decode_json(req.body)
    except BadJSON as exc:
        return sim_response(400, {"error": f"invalid JSON: {exc}"})
    if not isinstance(raw, dict):
        return sim_response(400, {"error": "expected a JSON object of fault settings"})
    try:
        changes = validate(raw)
    except FaultError as exc:
        return sim_response(400, {"error": str(exc)})
    app.faults.update(changes)
    refuse_for = changes.get("refuse_for", 0.0)
    if refuse_for > 0 and app.listener is not None:
        app.listener.refuse(refuse_for, keep=req.connection)
        response = sim_response(200, _faults_view(app))
        response.close = True  # this connection goes too: nothing is served while refusing
        return response
    return sim_response(200, _faults_view(app))


def h_sim_state(app: App, req: Request) -> Response:
    return sim_response(
        200,
        {
            "instances": [inst.to_json() for inst in app.store.instances()],
            "bad_hosts": app.store.bad_hosts(),
            "kills": app.kills(),
            "runner_id_counter": app.store.runner_id_counter(),
            "faults": _faults_view(app),
            "timeouts": app.monitor.timeouts.to_json(),
            "sweeps": app.monitor.sweeps(),
            "platform": app.monitor.platform(),
            "manager_log_lines": len(app.manager_log.lines()),
            "deploys": app.deploys(),
        },
    )
