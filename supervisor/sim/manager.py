"""``python -m supervisor.sim.manager --db FILE``: the simulated fleet manager.

A real HTTP server in its own process, with SQLite state, serving the manager API of
``reference/manager-api.md`` as the real (Go) manager does, quirks included: no
authentication; errors as JSON ``{"error": msg}`` but a plain-text 405 for a wrong method and
Go's plain-text ``404 page not found`` for an unknown path; JSON bodies decoded as Go's
``encoding/json`` does (field names matched case-insensitively, ``null`` fields left at their
zero value, a wrong type is a 400, anything after the first JSON value ignored); ``/bench-done``
does not look at the current state; log lines kept in memory only.

Not part of the real API, for tests and demos, under ``/sim/``:

- ``POST /sim/kill`` ``{"uuid", "reason"}``: kill an instance as an operator would.
- ``GET /sim/requests?since=SEQ&path=P&sim=1``: every request received, in arrival order.
- ``GET /sim/faults``, ``POST /sim/faults`` ``{switch: value, ..., "refuse_for": s}``.
- ``GET /sim/state``: instances, bad hosts, kills (with "destroyed"), the runner-id counter.

Fault switches (``manager_faults``): ``--fail-rate``, ``--fail-status``, ``--fail-next``,
``--fault-path``, ``--latency``, ``--latency-phase``, ``--seed``, ``--refuse-for``; also the
``CUZK_SIM_MANAGER_FAULTS`` environment variable (flags win). A faulted request is answered
without being applied, and is recorded in ``/sim/requests`` with ``"faulted": true``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from supervisor.sim.manager_faults import (
    ENV_VAR,
    OUTAGE_MESSAGE,
    Decision,
    FaultError,
    Faults,
    FaultSettings,
    parse_text,
    validate,
)
from supervisor.sim.manager_listener import Listener, ManagerHTTPServer
from supervisor.sim.manager_records import (
    DEFAULT_LOG_SOURCE,
    JournalEntry,
    LogBook,
    RequestJournal,
    split_log_body,
)
from supervisor.sim.manager_store import Instance, Store, rfc3339

DEFAULT_LISTEN = "127.0.0.1:8090"
DEFAULT_PARAM_TIMEOUT = 90 * 60.0
DEFAULT_BENCH_TIMEOUT = 45 * 60.0
DEFAULT_CHECK_INTERVAL = 60.0
MAX_BODY = 64 * 1024 * 1024  # a body larger than this is refused with 413 (the sim's limit)
JSON_PATHS = ("/register", "/param-done", "/bench-done", "/running", "/bad-host", "/sim/kill")
EXIT_USAGE = 2
EXIT_START = 1


# --- requests and responses --------------------------------------------------------------
class BadJSON(ValueError):
    """A body Go's json decoder would reject."""


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any  # email.message.Message
    body: bytes
    connection: socket.socket | None = None

    def param(self, name: str) -> str:
        values = self.query.get(name)
        return values[0] if values else ""


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


def json_response(status: int, value: Any) -> Response:
    """As Go's json.Encoder writes it: compact, with a trailing newline."""
    body = (json.dumps(value, separators=(",", ":")) + "\n").encode()
    return Response(status, body, "application/json")


def ok() -> Response:
    return json_response(200, {"ok": True})


def error(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """As Go's http.Error writes it."""
    merged = {"X-Content-Type-Options": "nosniff", **(headers or {})}
    return Response(status, text.encode(), "text/plain; charset=utf-8", merged)


def _reject_constant(name: str) -> Any:
    raise BadJSON(f"invalid character {name[0]!r} looking for beginning of value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_json(body: bytes) -> Any:
    """The first JSON value of ``body`` (what ``json.NewDecoder(r.Body).Decode`` reads)."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise BadJSON("EOF")
    try:
        value, _end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise BadJSON(exc.msg) from None
    return value


def decode_fields(body: bytes, fields: dict[str, type]) -> dict[str, Any]:
    """Decode a JSON object into ``fields`` (name → str or float) as Go decodes into a struct:
    unknown keys ignored, names matched case-insensitively, ``null`` leaves the zero value,
    a wrong type or a non-object is an error. Missing fields are absent from the result."""
    value = decode_json(body)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadJSON(f"cannot unmarshal {type(value).__name__} into a request object")
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        key = name if name in value else next((k for k in value if k.lower() == name), None)
        if key is None or value[key] is None:
            continue
        item = value[key]
        if kind is str:
            if not isinstance(item, str):
                raise BadJSON(f"cannot unmarshal {type(item).__name__} into field {name} (string)")
        elif kind is float:
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise BadJSON(f"cannot unmarshal {type(item).__name__} into field {name} (number)")
            try:
                item = float(item)
            except OverflowError:  # an integer too large for a float64
                item = math.inf
            if math.isinf(item):
                raise BadJSON(f"number out of range for field {name}")
        out[name] = item
    return out


# --- the application ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Timeouts:
    param: float = DEFAULT_PARAM_TIMEOUT
    bench: float = DEFAULT_BENCH_TIMEOUT
    check_interval: float = DEFAULT_CHECK_INTERVAL


class App:
    """Everything the handlers share: state, logs, journal, faults, the listener."""

    def __init__(
        self,
        store: Store,
        faults: Faults,
        timeouts: Timeouts,
        say: Callable[[str], None],
        destroy_command: str | None = None,
        verbose: bool = False,
    ) -> None:
        self.store = store
        self.faults = faults
        self.timeouts = timeouts
        self.say = say
        self.destroy_command = destroy_command
        self.verbose = verbose
        self.logs = LogBook()
        self.journal = RequestJournal()
        self.listener: Listener | None = None
        self._kills_lock = threading.Lock()
        self._kills: list[dict[str, Any]] = []

    def killed(self, inst: Instance, cause: str) -> None:
        """An instance was killed: the manager destroys it at once. Recorded for /sim/state;
        ``--destroy-command`` runs (in the background) with the instance in its environment."""
        event = {
            "uuid": inst.uuid,
            "label": inst.label,
            "runner_id": inst.runner_id,
            "reason": inst.kill_reason,
            "cause": cause,
            "ts": rfc3339(inst.killed_at or time.time()),
            "destroyed": True,
        }
        with self._kills_lock:
            self._kills.append(event)
        self.say(f"sim-manager killed {inst.uuid} ({inst.label}): {inst.kill_reason}")
        if self.destroy_command:
            threading.Thread(target=self._destroy, args=(inst,), daemon=True).start()

    def kills(self) -> list[dict[str, Any]]:
        with self._kills_lock:
            return list(self._kills)

    def _destroy(self, inst: Instance) -> None:
        assert self.destroy_command is not None
        env = {
            **os.environ,
            "CUZK_SIM_UUID": inst.uuid,
            "CUZK_SIM_LABEL": inst.label,
            "CUZK_SIM_RUNNER_ID": str(inst.runner_id),
            "CUZK_SIM_KILL_REASON": inst.kill_reason or "",
        }
        try:
            subprocess.run(self.destroy_command, shell=True, env=env, check=False, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            sys.stderr.write(f"sim-manager: destroy command failed: {exc}\n")

    def check_timeouts(self) -> list[Instance]:
        killed = self.store.expire(self.timeouts.param, self.timeouts.bench)
        for inst in killed:
            self.killed(inst, "timeout")
        return killed


# --- the real API's handlers -------------------------------------------------------------
def h_register(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"label": str, "min_rate": float})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    label = data.get("label", "")
    if not label:
        return error(400, "label is required")
    inst, _created = app.store.register(label, data.get("min_rate", 0.0))
    return json_response(200, {"uuid": inst.uuid, "runner_id": inst.runner_id})


def h_param_done(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"uuid": str})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    if app.store.param_done(data.get("uuid", "")) is None:
        return error(404, "instance not found")
    return ok()


def h_bench_done(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"uuid": str, "rate": float})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    result = app.store.bench_done(data.get("uuid", ""), data.get("rate", 0.0))
    if result is None:
        return error(404, "instance not found")
    if not result.passed:
        app.killed(result.instance, "bench-done failed")
    return json_response(200, {"ok": True, "passed": result.passed})


def h_running(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"uuid": str})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    if app.store.running(data.get("uuid", "")) is None:
        return error(404, "instance not found or already killed")
    return ok()


def h_runner_id(app: App, req: Request) -> Response:
    uuid = req.param("uuid")
    if not uuid:
        return error(400, "uuid is required")
    inst = app.store.get(uuid)
    if inst is None:
        return error(404, "instance not found")
    return json_response(200, {"runner_id": inst.runner_id})


def h_status(app: App, req: Request) -> Response:
    return json_response(200, [inst.to_json() for inst in app.store.instances()])


def h_log_push(app: App, req: Request) -> Response:
    uuid = req.headers.get("X-Instance-UUID", "")
    if not uuid:
        return error(400, "X-Instance-UUID header is required")
    source = req.headers.get("X-Log-Source", "") or DEFAULT_LOG_SOURCE
    app.logs.push(uuid, source, split_log_body(req.body), time.time())
    return Response(204)


def h_instance_logs(app: App, req: Request, uuid: str) -> Response:
    tail: int | None = None
    tail_text = req.param("tail")
    if re.fullmatch(r"-?\d+", tail_text):
        tail = int(tail_text)
    lines = app.logs.query(uuid, req.param("source") or None, tail)
    return json_response(200, [line.to_json() for line in lines])


def h_bad_host(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"machine_id": str, "reason": str})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    machine_id = data.get("machine_id", "")
    if not machine_id:
        return error(400, "machine_id is required")
    app.store.add_bad_host(machine_id, data.get("reason", ""))
    return ok()


# --- /sim/ -------------------------------------------------------------------------------
def h_sim_kill(app: App, req: Request) -> Response:
    try:
        data = decode_fields(req.body, {"uuid": str, "reason": str})
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    inst = app.store.kill(data.get("uuid", ""), data.get("reason", "") or "manual kill")
    if inst is None:
        return error(404, "instance not found")
    app.killed(inst, "operator")
    return json_response(200, {"ok": True, "instance": inst.to_json()})


def h_sim_requests(app: App, req: Request) -> Response:
    since_text = req.param("since")
    since = int(since_text) if since_text.isdigit() else 0
    entries = app.journal.entries(
        since=since,
        path=req.param("path") or None,
        include_sim=req.param("sim") in ("1", "true", "yes"),
    )
    return json_response(200, [e.to_json() for e in entries])


def h_sim_faults_get(app: App, req: Request) -> Response:
    return json_response(200, _faults_view(app))


def _faults_view(app: App) -> dict[str, Any]:
    view = app.faults.settings.to_json()
    view["refusing"] = app.listener is not None and not app.listener.listening
    return view


def h_sim_faults_post(app: App, req: Request) -> Response:
    try:
        raw = decode_json(req.body)
    except BadJSON as exc:
        return error(400, f"invalid JSON: {exc}")
    if not isinstance(raw, dict):
        return error(400, "expected a JSON object of fault settings")
    try:
        changes = validate(raw)
    except FaultError as exc:
        return error(400, str(exc))
    app.faults.update(changes)
    refuse_for = changes.get("refuse_for", 0.0)
    if refuse_for > 0 and app.listener is not None:
        app.listener.refuse(refuse_for, keep=req.connection)
        response = json_response(200, _faults_view(app))
        response.close = True  # this connection goes too: nothing is served while refusing
        return response
    return json_response(200, _faults_view(app))


def h_sim_state(app: App, req: Request) -> Response:
    return json_response(
        200,
        {
            "instances": [inst.to_json() for inst in app.store.instances()],
            "bad_hosts": app.store.bad_hosts(),
            "kills": app.kills(),
            "runner_id_counter": app.store.runner_id_counter(),
            "faults": _faults_view(app),
            "timeouts": {
                "param": app.timeouts.param,
                "bench": app.timeouts.bench,
                "check_interval": app.timeouts.check_interval,
            },
        },
    )


Handler = Callable[[App, Request], Response]
ROUTES: dict[str, dict[str, Handler]] = {
    "/register": {"POST": h_register},
    "/param-done": {"POST": h_param_done},
    "/bench-done": {"POST": h_bench_done},
    "/running": {"POST": h_running},
    "/runner-id": {"GET": h_runner_id},
    "/status": {"GET": h_status},
    "/api/log-push": {"POST": h_log_push},
    "/bad-host": {"POST": h_bad_host},
    "/sim/kill": {"POST": h_sim_kill},
    "/sim/requests": {"GET": h_sim_requests},
    "/sim/faults": {"GET": h_sim_faults_get, "POST": h_sim_faults_post},
    "/sim/state": {"GET": h_sim_state},
}
INSTANCE_LOGS_PREFIX = "/api/instance-logs/"


def route(app: App, req: Request) -> Response:
    """Go 1.22 ServeMux semantics: a GET pattern also serves HEAD; a known path with another
    method is a plain-text 405 with Allow; an unknown path is Go's plain-text 404."""
    method = "GET" if req.method == "HEAD" else req.method
    if req.path.startswith(INSTANCE_LOGS_PREFIX):
        uuid = req.path[len(INSTANCE_LOGS_PREFIX) :]
        if uuid and "/" not in uuid:
            if method != "GET":
                return text_response(405, "Method Not Allowed\n", {"Allow": "GET, HEAD"})
            return h_instance_logs(app, req, unquote(uuid))
        return text_response(404, "404 page not found\n")
    methods = ROUTES.get(req.path)
    if methods is None:
        return text_response(404, "404 page not found\n")
    handler = methods.get(method)
    if handler is None:
        allowed = sorted(methods) + (["HEAD"] if "GET" in methods else [])
        return text_response(405, "Method Not Allowed\n", {"Allow": ", ".join(allowed)})
    return handler(app, req)


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ManagerRequestHandler(BaseHTTPRequestHandler):
    """Reads one request, asks the fault switches, routes, answers, records it."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Go's server
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK
    server: ManagerHTTPServer

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def send_response(self, code: int, message: str | None = None) -> None:
        """Status line and Date, and no Server header (Go's server sends none)."""
        self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.verbose:
            super().log_message(format, *args)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            raise BodyError(400, "bad Content-Length") from None
        if length < 0:
            raise BodyError(400, "bad Content-Length")
        if length > MAX_BODY:
            raise BodyError(413, "request body too large")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BodyError(400, "bad chunk size") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise BodyError(413, "request body too large")
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)  # the CRLF after the chunk

    def _handle(self) -> None:
        app: App = self.server.app
        received = time.time()
        start = time.monotonic()
        url = urlsplit(self.path)
        entry = JournalEntry(
            seq=app.journal.next_seq(),
            ts=received,
            method=self.command,
            path=url.path,
            query=url.query,
            sim=url.path == "/sim" or url.path.startswith("/sim/"),
            log_source=self.headers.get("X-Log-Source"),
            instance_uuid=self.headers.get("X-Instance-UUID"),
        )
        try:
            body = self._read_body()
        except BodyError as exc:
            self.close_connection = True
            response = error(exc.status, str(exc))
            response.close = True
            self._answer(response)
            entry.status = response.status
            entry.answered = True
            entry.duration = time.monotonic() - start
            app.journal.record(entry)
            return
        entry.body_bytes = len(body)
        if url.path in JSON_PATHS:
            try:
                entry.json = decode_json(body)
            except BadJSON:
                entry.json = None
        req = Request(
            self.command, url.path, parse_qs(url.query), self.headers, body, self.connection
        )
        decision = Decision() if entry.sim else app.faults.decide(url.path)
        if decision.delay_before > 0:
            time.sleep(decision.delay_before)
        if decision.fail:
            response = error(decision.status, OUTAGE_MESSAGE)
            entry.faulted = True
        else:
            try:
                response = route(app, req)
            except Exception:  # a bug answers 500, the server lives on
                traceback.print_exc(file=sys.stderr)
                response = error(500, "internal error")
        if url.path == "/api/log-push" and response.status == 204:
            entry.lines_stored = len(split_log_body(body))
        if decision.delay_after > 0:
            time.sleep(decision.delay_after)
        entry.status = response.status
        try:
            self._answer(response)
            entry.answered = True
        finally:
            entry.duration = time.monotonic() - start
            app.journal.record(entry)

    def _answer(self, response: Response) -> None:
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if response.content_type is not None:
            self.send_header("Content-Type", response.content_type)
        if response.status != 204:
            self.send_header("Content-Length", str(len(response.body)))
        if response.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD" and response.status != 204:
            self.wfile.write(response.body)
        self.wfile.flush()


# --- the process -------------------------------------------------------------------------
class UsageError(Exception):
    pass


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds: ``90``, ``0.5``, ``250ms``, ``45m``, ``1.5h``."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (seconds, or with ms/s/m/h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_listen(text: str, allow_public: bool) -> tuple[str, int, socket.AddressFamily]:
    """``host:port`` or ``[v6]:port`` (port 0: any free port); loopback unless allowed."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"bad --listen {text!r}: expected host:port, as in 127.0.0.1:8090")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"bad --listen {text!r}: {host!r} is not an IP address") from None
    if not ip.is_loopback and not allow_public:
        raise UsageError(
            f"refusing to listen on {host}, which is not loopback: the manager API has no "
            "authentication (pass --allow-public to do it anyway)"
        )
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return str(ip), int(port_text), family


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.sim.manager",
        description="Simulated fleet manager: the manager HTTP API with SQLite state and "
        "switchable faults (5xx, latency, refused connections).",
    )
    p.add_argument("--db", type=Path, required=True, help="SQLite file (created if missing)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port; port 0 picks a free one")
    p.add_argument("--allow-public", action="store_true", help="allow a non-loopback --listen")
    durations = "seconds, or with a unit: 250ms, 45m, 1.5h"
    p.add_argument(
        "--param-timeout",
        type=parse_duration,
        default=DEFAULT_PARAM_TIMEOUT,
        metavar="DURATION",
        help=f"registered longer than this is killed (default 90m; {durations})",
    )
    p.add_argument(
        "--bench-timeout",
        type=parse_duration,
        default=DEFAULT_BENCH_TIMEOUT,
        metavar="DURATION",
        help="params_done longer than this is killed (default 45m)",
    )
    p.add_argument(
        "--check-interval",
        type=parse_duration,
        default=DEFAULT_CHECK_INTERVAL,
        metavar="DURATION",
        help="how often the timeouts are checked (default 60s)",
    )
    g = p.add_argument_group(f"faults (also ${ENV_VAR}; flags win)")
    g.add_argument("--fail-rate", type=float, help="share of requests answered 503 (0..1)")
    g.add_argument("--fail-status", type=int, help="status of a faulted answer (default 503)")
    g.add_argument("--fail-next", type=int, help="fail the next N requests")
    g.add_argument(
        "--fault-path",
        action="append",
        dest="paths",
        metavar="PATH",
        help="apply faults to this path only (repeatable; default every non-/sim path)",
    )
    g.add_argument(
        "--latency", type=parse_duration, metavar="DURATION", help="added to each request"
    )
    g.add_argument("--latency-phase", choices=("before", "after"), help="default after")
    g.add_argument("--seed", type=int, help="seed of the fault RNG (default random, shown)")
    g.add_argument(
        "--refuse-for",
        type=parse_duration,
        metavar="DURATION",
        help="refuse connections for this long from start",
    )
    p.add_argument(
        "--destroy-command",
        help="shell command run when an instance is killed (env CUZK_SIM_UUID, CUZK_SIM_LABEL, "
        "CUZK_SIM_RUNNER_ID, CUZK_SIM_KILL_REASON)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    return p


def fault_settings(args: argparse.Namespace, env: dict[str, str]) -> tuple[FaultSettings, float]:
    """Environment, then flags; returns the settings and the start's refuse window."""
    changes = parse_text(env.get(ENV_VAR, ""))
    flags = {
        "fail_rate": args.fail_rate,
        "fail_status": args.fail_status,
        "fail_next": args.fail_next,
        "paths": args.paths,
        "latency": args.latency,
        "latency_phase": args.latency_phase,
        "seed": args.seed,
        "refuse_for": args.refuse_for,
    }
    changes.update(validate({k: v for k, v in flags.items() if v is not None}))
    refuse_for = float(changes.pop("refuse_for", 0.0))
    return FaultSettings(**changes), refuse_for


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _check_loop(app: App, stop: threading.Event) -> None:
    while not stop.wait(app.timeouts.check_interval):
        try:
            app.check_timeouts()
        except Exception:  # the next tick tries again
            traceback.print_exc(file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        host, port, family = parse_listen(args.listen, args.allow_public)
        settings, refuse_for = fault_settings(args, dict(os.environ))
        if args.check_interval <= 0:
            raise UsageError("--check-interval must be > 0")
    except (UsageError, FaultError) as exc:
        sys.stderr.write(f"sim-manager: {exc}\n")
        return EXIT_USAGE

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        store = Store(args.db)
    except Exception as exc:  # sqlite3 errors, permissions
        sys.stderr.write(f"sim-manager: cannot open database {args.db}: {exc}\n")
        return EXIT_START
    timeouts = Timeouts(args.param_timeout, args.bench_timeout, args.check_interval)
    app = App(store, Faults(settings), timeouts, say, args.destroy_command, args.verbose)
    server = ManagerHTTPServer((host, port), ManagerRequestHandler, app, family)
    listener = Listener(server, host, port, say)
    app.listener = listener
    try:
        listener.start(refuse_for)
    except OSError as exc:
        sys.stderr.write(f"sim-manager: cannot bind {args.listen}: {exc}\n")
        store.close()
        return EXIT_START
    checker = threading.Thread(target=_check_loop, args=(app, stop), name="timeouts", daemon=True)
    checker.start()
    while not stop.wait(1.0):
        pass
    listener.stop()
    checker.join(timeout=5)
    store.close()
    say("sim-manager stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
