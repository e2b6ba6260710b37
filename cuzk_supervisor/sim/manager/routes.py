"""The simulated manager's mux, as the real server's (Go's ServeMux without method patterns):
exact paths, and subtrees (a trailing "/") for the paths that carry an id; the dashboard at
"/" takes everything else; each handler checks its own method. A body Go's decoder rejects
(``gojson.BadJSON``, from any handler) is answered 400 "bad request: <its error>".
"""

from __future__ import annotations

from collections.abc import Callable

from cuzk_supervisor.sim.manager.api import (
    h_bad_host_delete,
    h_bad_host_get,
    h_bad_host_post,
    h_bench_done,
    h_deploy,
    h_instance_logs,
    h_kill,
    h_log_push,
    h_manager_logs,
    h_param_done,
    h_register,
    h_runner_id,
    h_running,
    h_status,
    h_ui,
)
from cuzk_supervisor.sim.manager.app import App
from cuzk_supervisor.sim.manager.gojson import BadJSON
from cuzk_supervisor.sim.manager.simapi import (
    h_sim_counters,
    h_sim_faults_get,
    h_sim_faults_post,
    h_sim_kill,
    h_sim_manager_log,
    h_sim_requests,
    h_sim_state,
    h_sim_sweep,
)
from cuzk_supervisor.sim.manager.wire import Request, Response, bad_request, method_not_allowed

Handler = Callable[[App, Request], Response]
ROUTES: dict[str, dict[str, Handler]] = {
    "/register": {"POST": h_register},
    "/param-done": {"POST": h_param_done},
    "/bench-done": {"POST": h_bench_done},
    "/running": {"POST": h_running},
    "/runner-id": {"GET": h_runner_id},
    "/status": {"GET": h_status},
    "/bad-host": {"POST": h_bad_host_post, "GET": h_bad_host_get},
    "/bad-host/": {"DELETE": h_bad_host_delete},
    "/api/log-push": {"POST": h_log_push},
    "/api/instance-logs/": {"GET": h_instance_logs},
    "/api/manager-logs": {"GET": h_manager_logs},
    "/api/kill": {"POST": h_kill},
    "/api/deploy": {"POST": h_deploy},
    "/sim/kill": {"POST": h_sim_kill},
    "/sim/sweep": {"POST": h_sim_sweep},
    "/sim/requests": {"GET": h_sim_requests},
    "/sim/manager-log": {"GET": h_sim_manager_log},
    "/sim/counters": {"GET": h_sim_counters},
    "/sim/faults": {"GET": h_sim_faults_get, "POST": h_sim_faults_post},
    "/sim/state": {"GET": h_sim_state},
}
SUBTREES = tuple(sorted((p for p in ROUTES if p.endswith("/")), key=len, reverse=True))


def endpoint_of(path: str) -> str:
    """The route a path is counted under: its exact route, its subtree (``/api/instance-logs/``),
    or ``other``."""
    if path in ROUTES:
        return path
    subtree = next((p for p in SUBTREES if path.startswith(p)), None)
    return subtree if subtree is not None else "other"


def route(app: App, req: Request) -> Response:
    """Go's ServeMux without method patterns: an exact path, else the longest subtree, else
    the dashboard at "/"; a subtree's path without its slash is redirected (301) to it. The
    handler's own check answers a wrong method (HEAD included) with a plain-text 405."""
    methods = ROUTES.get(req.path)
    if methods is None:
        subtree = next((p for p in SUBTREES if req.path.startswith(p)), None)
        if subtree is None:
            if req.path + "/" in ROUTES:
                target = req.path + "/" + (f"?{req.raw_query}" if req.raw_query else "")
                body = f'<a href="{target}">Moved Permanently</a>.\n\n'
                return Response(
                    301,
                    body.encode() if req.method == "GET" else b"",
                    "text/html; charset=utf-8",
                    {"Location": target},
                )
            return h_ui(app, req)
        methods = ROUTES[subtree]
    handler = methods.get(req.method)
    if handler is None:
        return method_not_allowed()
    try:
        return handler(app, req)
    except BadJSON as exc:
        return bad_request(exc)
