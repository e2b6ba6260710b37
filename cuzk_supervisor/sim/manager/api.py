"""The real manager's API as the simulated one answers it (``docs/manager-api.md``): one
handler per endpoint, each with the real texts and its own method check (the mux:
``routes``): register, the three reports, ``/runner-id``, ``/status``, bad hosts, log
push and the logs' reads, the dashboard's kill and deploy, and the dashboard's page.
"""

from __future__ import annotations

import time

from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.gojson import decode_struct
from cuzk_supervisor.sim.manager.instances import MANUAL_KILL_REASON, REGISTERED
from cuzk_supervisor.sim.manager.platform import vast_id_from_label
from cuzk_supervisor.sim.manager.records import DEFAULT_LOG_SOURCE, DEFAULT_TAIL, split_log_body
from cuzk_supervisor.sim.manager.vast import DEFAULT_MIN_RATE
from cuzk_supervisor.sim.manager.wire import (
    Request,
    Response,
    error,
    go_atoi_positive,
    go_bool,
    json_response,
    not_found,
    ok,
)

MANAGER_LOGS_DEFAULT_TAIL = 500  # /api/manager-logs without a usable tail
UI_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>vast-manager (simulated)</title></head>\n"
    "<body><h1>vast-manager (simulated)</h1><p>See /status and /sim/state.</p></body></html>\n"
)


def _segment_after(path: str, name: str) -> str:
    """The path segment after the first ``name`` segment ("" if none); more are ignored."""
    parts = path.lstrip("/").split("/")
    return next((parts[n + 1] for n, part in enumerate(parts[:-1]) if part == name), "")


def h_register(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "RegisterReq", {"label": str, "min_rate": float})
    label = data.get("label", "")
    if not label:
        return error(400, "label is required")
    inst, created = app.store.register(label, data.get("min_rate", 0.0))
    if created:
        app.log(
            f"[register] new label={label} uuid={inst.uuid} runner_id={inst.runner_id} "
            f"min_rate={inst.min_rate:.1f}"
        )
    else:
        app.log(f"[register] re-register label={label} uuid={inst.uuid} runner_id={inst.runner_id}")
    return json_response(200, {"uuid": inst.uuid, "runner_id": inst.runner_id})


def h_param_done(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "UUIDReq", {"uuid": str})
    uuid = data.get("uuid", "")
    before = app.store.get(uuid)
    if app.store.param_done(uuid) is None:
        return error(404, "instance not found")
    if before is not None and before.state != REGISTERED:
        app.log(f"[param-done] uuid={uuid} already in state={before.state}, no-op")
    else:
        app.log(f"[param-done] uuid={uuid}")
    return ok()


def h_bench_done(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "BenchDoneReq", {"uuid": str, "rate": float})
    rate = data.get("rate", 0.0)
    result = app.store.bench_done(data.get("uuid", ""), rate)
    if result is None:
        return error(404, "instance not found")
    inst = result.instance
    if not result.passed:  # destroyed at once when the label names the platform instance
        app.killed(inst, "bench-done failed", vast_id_from_label(inst.label) is not None)
    app.log(
        f"[bench-done] uuid={inst.uuid} rate={rate:.1f} min_rate={inst.min_rate:.1f} "
        f"passed={go_bool(result.passed)}"
    )
    return json_response(200, {"ok": True, "passed": result.passed})


def h_running(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "UUIDReq", {"uuid": str})
    uuid = data.get("uuid", "")
    if app.store.running(uuid) is None:
        return error(404, "instance not found or already killed")
    app.log(f"[running] uuid={uuid}")
    return ok()


def h_runner_id(app: App, req: Request) -> Response:
    uuid = req.param("uuid")
    if not uuid:
        return error(400, "uuid query param required")
    inst = app.store.get(uuid)
    if inst is None:
        return error(404, "instance not found")
    return json_response(200, {"runner_id": inst.runner_id})


def h_status(app: App, req: Request) -> Response:
    return Response(200, app.status_body(), "application/json")


def h_log_push(app: App, req: Request) -> Response:
    uuid = req.headers.get("X-Instance-UUID", "")
    if not uuid:
        return error(400, "X-Instance-UUID header required")
    source = req.headers.get("X-Log-Source", "") or DEFAULT_LOG_SOURCE
    app.logs.push(uuid, source, split_log_body(req.body), time.time())
    return Response(204)


def h_instance_logs(app: App, req: Request) -> Response:
    uuid = _segment_after(req.path, "instance-logs")
    if not uuid:
        return error(400, "uuid required in path")
    tail = go_atoi_positive(req.param("tail"), DEFAULT_TAIL)
    lines = app.logs.query(uuid, req.param("source") or None, tail)
    return json_response(200, [line.to_json() for line in lines])


def h_manager_logs(app: App, req: Request) -> Response:
    tail = go_atoi_positive(req.param("tail"), MANAGER_LOGS_DEFAULT_TAIL)
    return json_response(200, [line.to_json() for line in app.manager_log.lines(tail)])


def h_kill(app: App, req: Request) -> Response:
    """The dashboard's kill: destroy the container when a ``vast_id`` > 0 is given, mark a
    live record ``killed`` ("manually killed via UI"); always ``{"ok": true}``."""
    data = decode_struct(req.body, "", {"vast_id": int, "uuid": str})
    vast_id = data.get("vast_id", 0)
    uuid = data.get("uuid", "")
    destroyed = vast_id > 0
    if destroyed:
        app.log(f"[kill] manually destroying vast instance {vast_id} (uuid={uuid})")
    inst = app.store.kill(uuid, MANUAL_KILL_REASON, again=False) if uuid else None
    if inst is not None or destroyed:
        app.killed(inst, "manual", destroyed, vast_id if destroyed else None)
    return ok()


def h_deploy(app: App, req: Request) -> Response:
    """The dashboard's Deploy: ``vastai create instance`` for an offer (``--vastai``)."""
    data = decode_struct(req.body, "DeployReq", {"offer_id": int, "min_rate": float})
    offer_id = data.get("offer_id", 0)
    if offer_id <= 0:
        return error(400, "bad request: offer_id required")
    if app.vast is None:
        return error(500, "deploy not configured")
    min_rate = data.get("min_rate", 0.0) or DEFAULT_MIN_RATE  # Go's zero value: the default
    instance_id, reason = app.deploy(offer_id, min_rate)
    if instance_id is None:
        return error(500, f"vastai create failed: {reason}")
    return json_response(200, {"ok": True, "instance_id": instance_id})


def h_bad_host_post(app: App, req: Request) -> Response:
    data = decode_struct(req.body, "BadHostReq", {"machine_id": str, "reason": str})
    machine_id = data.get("machine_id", "")
    if not machine_id:
        return error(400, "machine_id required")
    reason = data.get("reason", "")
    app.store.add_bad_host(machine_id, reason)
    app.log(f"[bad-host] added machine_id={machine_id} reason={reason}")
    return ok()


def h_bad_host_get(app: App, req: Request) -> Response:
    return json_response(200, app.store.bad_hosts_listed())


def h_bad_host_delete(app: App, req: Request) -> Response:
    machine_id = _segment_after(req.path, "bad-host")
    if not machine_id:
        return error(400, "machine_id required in path")
    app.store.remove_bad_host(machine_id)
    app.log(f"[bad-host] removed machine_id={machine_id}")
    return ok()


def h_ui(app: App, req: Request) -> Response:
    if req.path != "/":
        return not_found()
    return Response(200, UI_PAGE.encode(), "text/html; charset=utf-8")
