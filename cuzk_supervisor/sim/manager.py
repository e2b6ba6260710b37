"""``python -m cuzk_supervisor.sim.manager --db FILE``: the simulated fleet manager.

A real HTTP server in its own process, with SQLite state, serving the manager API of
``reference/manager-api.md`` as the real (Go) manager does, quirks included: no
authentication; errors as JSON ``{"error": msg}`` with the real texts ("bad request: <Go's
decode error>", "label is required", "uuid query param required", "X-Instance-UUID header
required", "machine_id required"), but a plain-text ``method not allowed`` 405 (no ``Allow``
header; ``HEAD`` is a wrong method too) and Go's plain-text ``404 page not found``; JSON
written as Go's encoder writes it (``30``, not ``30.0``) and read as Go's decoder reads it
(``manager_gojson``); ``/bench-done`` does not look at the current state; ``GET /status`` by
runner id, highest first, with whole-second ``YYYY-MM-DD HH:MM:SS`` UTC times; instance logs
kept in memory only (10,000 lines each, the oldest 1,000 dropped at once; ``ts`` in integer
milliseconds; the last 1,000 lines without ``tail``; ``source=all`` is every source; a ``\\r``
kept); the manager's own log (5,000 lines; a ``[running] uuid=…`` line per ``/running``); the
dashboard's ``POST /api/kill {"uuid", "vast_id"}`` ("manually killed via UI"); and the monitor:
a sweep first at +10 s, then every 60 s, killing timeouts ("param fetch timeout (90min)",
"benchmark timeout (45min)"), benches below min_rate ("bench_rate X below min_rate Y") and,
given the platform's instance list (``--instances FILE``), every live record that list does not
name ("instance disappeared from vast"). ``--time-scale`` divides the sweep's durations.

With ``--vastai PROG`` (a ``vastai`` CLI program) the real manager's platform side too:
``POST /api/deploy {"offer_id", "min_rate"}`` runs ``PROG create instance OFFER --image IMG
--disk 250 --env "-e PAVAIL=… -e PAVAIL_SERVER=… -e MIN_RATE=30.0" --ssh --direct
--onstart-cmd "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"`` (argv,
no shell; PAVAIL and PAVAIL_SERVER from the manager's own environment; ``--deploy-image``,
default ``magik6k/curio-cuzk:latest``) and answers ``{"ok": true, "instance_id": N}`` from
the ``new_contract`` it prints; the sweep reads ``PROG show instances --raw`` (not with
``--instances``); a destroyed container runs ``PROG destroy instance ID`` in the background.

Not part of the real API, for tests and demos, under ``/sim/`` (never faulted):

- ``POST /sim/kill`` ``{"uuid", "reason"}``: kill an instance with any reason (the real
  ``/api/kill`` always says "manually killed via UI").
- ``POST /sim/sweep``: run one sweep of the monitor now; answers the kills it made.
- ``GET /sim/requests?since=SEQ&path=P&sim=1``: every request received, in arrival order.
- ``GET /sim/manager-log?tail=N``: the manager's own log (as ``/api/manager-logs``, all of it
  without ``tail``).
- ``GET /sim/counters?reports=1``: requests, bytes in and out, answers by status, faulted,
  throttled and applied requests per endpoint (``manager_counters``); lines written into the
  manager's own log and pushed instance log lines received, dropped and kept; with
  ``reports=1`` how many times each instance's reports were applied.
- ``GET /sim/faults``, ``POST /sim/faults`` ``{switch: value, ..., "refuse_for": s,
  "throttle_for": s}``.
- ``GET /sim/state``: instances, bad hosts, kills (with "destroyed"), the runner-id counter,
  the sweeps, the platform list last read, the timeouts in force.

Fault switches (``manager_faults``): ``--fail-rate``, ``--fail-status``, ``--fail-next``,
``--html-rate``, ``--html-status``, ``--bad-body-rate``, ``--bad-body-kind``,
``--bad-body-applied``, ``--maintenance-next``, ``--maintenance-path``, ``--fault-path``,
``--latency``, ``--latency-phase``, ``--throttle-rate``, ``--throttle-status``,
``--retry-after``, ``--retry-after-form``, ``--throttle-for``, ``--proxy-rate``,
``--proxy-next``, ``--proxy-page`` (a proxy's own pages: HTML, plain or empty 404s,
401/403/405/413/429/502/503 pages, resets; ``manager_proxy``), ``--seed``, ``--refuse-for``;
also the ``CUZK_SIM_MANAGER_FAULTS`` environment variable (flags win). A faulted request is answered
without being applied (but see ``--bad-body-applied``), and is recorded in ``/sim/requests``
with ``"faulted": true`` and its ``"fault"`` kind.

At fleet scale it behaves as the real one does: ``GET /status`` answers the whole table, killed
rows included, every time (its body is cached between writes: the bytes are the real one's, the
CPU is not); a proxy in front can be simulated that throttles a share of requests (429 or 503,
``Retry-After`` in seconds, as an HTTP-date, or none).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
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

from cuzk_supervisor.sim.manager_counters import REPORT_PATHS, Counters
from cuzk_supervisor.sim.manager_faults import (
    ENV_VAR,
    ERROR_KIND,
    OUTAGE_MESSAGE,
    PROXY_KIND,
    RETRY_AFTER_FORMS,
    THROTTLE_KIND,
    Decision,
    FaultError,
    Faults,
    FaultSettings,
    parse_text,
    validate,
)
from cuzk_supervisor.sim.manager_gojson import BadJSON, decode_struct, go_dumps
from cuzk_supervisor.sim.manager_listener import Listener, ManagerHTTPServer
from cuzk_supervisor.sim.manager_proxy import (
    BAD_BODY_KINDS,
    RESET,
    reset_on_close,
    retry_after_value,
)
from cuzk_supervisor.sim.manager_records import (
    DEFAULT_LOG_SOURCE,
    DEFAULT_TAIL,
    JournalEntry,
    LogBook,
    ManagerLog,
    RequestJournal,
    split_log_body,
)
from cuzk_supervisor.sim.manager_store import (
    MANUAL_KILL_REASON,
    REGISTERED,
    Instance,
    Platform,
    PlatformInstance,
    Store,
    SweepKill,
    rfc3339,
    vast_id_from_label,
)
from cuzk_supervisor.sim.manager_vast import (
    CREATE_TIMEOUT,
    DEFAULT_IMAGE,
    DEFAULT_MIN_RATE,
    VastCLI,
    VastError,
)

DEFAULT_LISTEN = "127.0.0.1:8090"
DEFAULT_PARAM_TIMEOUT = 90 * 60.0
DEFAULT_BENCH_TIMEOUT = 45 * 60.0
DEFAULT_CHECK_INTERVAL = 60.0
DEFAULT_FIRST_CHECK = 10.0
MANAGER_LOGS_DEFAULT_TAIL = 500  # /api/manager-logs without a usable tail
MAX_BODY = 64 * 1024 * 1024  # a body larger than this is refused with 413 (the sim's limit)
JSON_PATHS = (
    "/register",
    "/param-done",
    "/bench-done",
    "/running",
    "/bad-host",
    "/api/kill",
    "/sim/kill",
    "/api/deploy",
)
EXIT_USAGE = 2
EXIT_START = 1
UI_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>vast-manager (simulated)</title></head>\n"
    "<body><h1>vast-manager (simulated)</h1><p>See /status and /sim/state.</p></body></html>\n"
)


# --- requests and responses --------------------------------------------------------------
@dataclass(slots=True)
class Request:
    method: str
    path: str  # decoded, as Go's r.URL.Path
    query: dict[str, list[str]]
    headers: Any  # email.message.Message
    body: bytes
    connection: socket.socket | None = None
    raw_query: str = ""

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
    """As Go's json.Encoder writes it: compact, Go's numbers, a trailing newline."""
    return Response(status, (go_dumps(value) + "\n").encode(), "application/json")


def sim_response(status: int, value: Any) -> Response:
    """A ``/sim/`` answer: plain Python JSON (the sim's own, not the real API)."""
    body = (json.dumps(value, separators=(",", ":")) + "\n").encode()
    return Response(status, body, "application/json")


def ok() -> Response:
    return json_response(200, {"ok": True})


def error(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def bad_request(exc: BadJSON) -> Response:
    return error(400, f"bad request: {exc}")


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """As Go's http.Error writes it."""
    merged = {"X-Content-Type-Options": "nosniff", **(headers or {})}
    return Response(status, text.encode(), "text/plain; charset=utf-8", merged)


def method_not_allowed() -> Response:
    """The real handlers' own method check: ``http.Error(w, "method not allowed", 405)``."""
    return text_response(405, "method not allowed\n")


def not_found() -> Response:
    return text_response(404, "404 page not found\n")


def decode_json(body: bytes) -> Any:
    """The first JSON value of ``body`` as plain Python (for the journal); BadJSON if none."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise BadJSON("EOF")
    try:
        value, _end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise BadJSON(exc.msg) from None
    return value


def go_bool(value: bool) -> str:
    return "true" if value else "false"


# --- the application ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Timeouts:
    """The monitor's durations in force (already divided by ``time_scale``)."""

    param: float = DEFAULT_PARAM_TIMEOUT
    bench: float = DEFAULT_BENCH_TIMEOUT
    check_interval: float = DEFAULT_CHECK_INTERVAL
    first_check: float = DEFAULT_FIRST_CHECK
    time_scale: float = 1.0

    @classmethod
    def scaled(
        cls, param: float, bench: float, check_interval: float, first_check: float, scale: float
    ) -> Timeouts:
        return cls(param / scale, bench / scale, check_interval / scale, first_check / scale, scale)

    def to_json(self) -> dict[str, float]:
        return {
            "param": self.param,
            "bench": self.bench,
            "check_interval": self.check_interval,
            "first_check": self.first_check,
            "time_scale": self.time_scale,
        }


def parse_platform(text: str) -> Platform:
    """The platform's instance list: a JSON array of instances as ``vastai show instances
    --raw`` prints them (objects with ``id``, and ``label`` and ``machine_id`` where known;
    other keys ignored) or of bare instance ids. ValueError, with the reason, otherwise."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("expected a JSON array of instances")
    entries: list[PlatformInstance] = []
    for n, item in enumerate(raw):
        if isinstance(item, int) and not isinstance(item, bool):
            entries.append(PlatformInstance(item))
            continue
        if not isinstance(item, dict):
            raise ValueError(f"item {n}: expected an object or an instance id")
        ident, label, machine = item.get("id"), item.get("label"), item.get("machine_id")
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise ValueError(f"item {n}: 'id' must be an integer")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"item {n}: 'label' must be a string or null")
        if machine is not None and (not isinstance(machine, int) or isinstance(machine, bool)):
            raise ValueError(f"item {n}: 'machine_id' must be an integer or null")
        entries.append(PlatformInstance(ident, label or "", machine))
    return Platform(tuple(entries))


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
        platform_file: Path | None = None,
        vast: VastCLI | None = None,
    ) -> None:
        self.store = store
        self.faults = faults
        self.timeouts = timeouts
        self.say = say
        self.destroy_command = destroy_command
        self.verbose = verbose
        self.platform_file = platform_file
        self.vast = vast
        self.create_timeout = CREATE_TIMEOUT
        self._deploys: list[dict[str, Any]] = []
        self.logs = LogBook()
        self.manager_log = ManagerLog()
        self.journal = RequestJournal()
        self.counters = Counters()
        self._status_cache: tuple[tuple[int, int], bytes] | None = None
        self.listener: Listener | None = None
        self._lock = threading.Lock()
        self._kills: list[dict[str, Any]] = []
        self._sweep_lock = threading.Lock()  # one sweep at a time (the loop, /sim/sweep)
        self._sweeps: dict[str, Any] = {"count": 0, "last_at": None, "error": None}
        self._platform: Platform | None = None

    def status_body(self) -> bytes:
        """``GET /status``'s body: the whole table, killed rows included, as the real one
        answers it every time; encoded again only after the database changed."""
        key = self.store.change_key()
        with self._lock:
            cached = self._status_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        body = (go_dumps([inst.to_json() for inst in self.store.instances()]) + "\n").encode()
        with self._lock:
            self._status_cache = (key, body)
        return body

    def log(self, message: str) -> None:
        """A line of the manager's own log (``log.Printf`` in the real one)."""
        self.manager_log.write(message, time.time())
        if self.verbose:
            sys.stderr.write(message + "\n")

    def killed(
        self, inst: Instance | None, cause: str, destroyed: bool, vast_id: int | None = None
    ) -> None:
        """An instance was killed (``inst``), its container destroyed (``destroyed``), or
        both. Recorded for ``/sim/state``; ``--destroy-command`` runs (in the background)
        for a destroyed one, with the instance in its environment."""
        if vast_id is None and inst is not None:
            vast_id = vast_id_from_label(inst.label)
        event = {
            "uuid": inst.uuid if inst else None,
            "label": inst.label if inst else None,
            "runner_id": inst.runner_id if inst else None,
            "reason": inst.kill_reason if inst else None,
            "cause": cause,
            "ts": rfc3339(inst.killed_at if inst and inst.killed_at else time.time()),
            "destroyed": destroyed,
            "vast_id": vast_id,
        }
        with self._lock:
            self._kills.append(event)
        if inst is not None:
            self.say(f"sim-manager killed {inst.uuid} ({inst.label}): {inst.kill_reason}")
        if destroyed:
            if vast_id is not None:
                self.log(f"[monitor] destroyed vast instance {vast_id}")
            if self.destroy_command:
                threading.Thread(target=self._destroy, args=(inst, vast_id), daemon=True).start()
            if self.vast is not None and vast_id is not None and vast_id > 0:
                threading.Thread(target=self._vast_destroy, args=(vast_id,), daemon=True).start()

    def kills(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._kills)

    def _destroy(self, inst: Instance | None, vast_id: int | None) -> None:
        assert self.destroy_command is not None
        env = {
            **os.environ,
            "CUZK_SIM_UUID": inst.uuid if inst else "",
            "CUZK_SIM_LABEL": inst.label if inst else "",
            "CUZK_SIM_RUNNER_ID": str(inst.runner_id) if inst else "",
            "CUZK_SIM_KILL_REASON": (inst.kill_reason or "") if inst else "",
            "CUZK_SIM_VAST_ID": "" if vast_id is None else str(vast_id),
        }
        try:
            subprocess.run(self.destroy_command, shell=True, env=env, check=False, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            sys.stderr.write(f"sim-manager: destroy command failed: {exc}\n")

    def _vast_destroy(self, vast_id: int) -> None:
        assert self.vast is not None
        try:
            self.vast.destroy(vast_id)
        except VastError as exc:
            self.log(f"[monitor] destroy vast instance {vast_id} failed: {exc}")

    # --- deploys -------------------------------------------------------------------------
    def deploy(self, offer_id: int, min_rate: float) -> tuple[int | None, str | None]:
        """``create instance`` for ``offer_id``: (instance id, None) or (None, reason)."""
        assert self.vast is not None
        pavail = os.environ.get("PAVAIL", "")
        server = os.environ.get("PAVAIL_SERVER", "")
        try:
            instance_id: int | None = self.vast.create(
                offer_id, min_rate, pavail, server, self.create_timeout
            )
            reason: str | None = None
        except VastError as exc:
            instance_id, reason = None, str(exc)
        with self._lock:
            self._deploys.append(
                {
                    "offer_id": offer_id,
                    "min_rate": min_rate,
                    "instance_id": instance_id,
                    "ok": instance_id is not None,
                }
            )
        if instance_id is not None:
            self.log(
                f"[deploy] offer={offer_id} image={self.vast.image} min_rate={min_rate:.1f} "
                f"instance={instance_id}"
            )
        else:
            self.log(f"[deploy] offer={offer_id} min_rate={min_rate:.1f} failed: {reason}")
        return instance_id, reason

    def deploys(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(d) for d in self._deploys]

    # --- the monitor ---------------------------------------------------------------------
    def read_platform(self) -> Platform | None:
        """The platform list for this sweep (None: no ``--instances`` nor ``--vastai``).
        ValueError or OSError when it cannot be read: the sweep is then skipped, as the real
        one's."""
        if self.vast is not None:
            return parse_platform(self.vast.show_instances())
        if self.platform_file is None:
            return None
        return parse_platform(self.platform_file.read_text())

    def sweep(self) -> list[SweepKill]:
        """One cycle of the real manager's monitor."""
        with self._sweep_lock:
            try:
                platform = self.read_platform()
            except (OSError, ValueError) as exc:
                message = f"enumerate vast instances: {exc}"
                self.log(f"[monitor] error: {message} (will retry next cycle)")
                self._note_sweep(message)
                return []
            if platform is not None:
                self._platform = platform
                self.log(f"[monitor] cached {len(platform.entries)} vast instances")
            kills = self.store.sweep(self.timeouts.param, self.timeouts.bench, platform)
            for kill in kills:
                inst = kill.instance
                if kill.cause == "disappeared":
                    self.log(
                        f"[monitor] instance disappeared from vast uuid={inst.uuid} "
                        f"label={inst.label} state={kill.state_before}"
                    )
                else:
                    self.log(
                        f"[monitor] killing uuid={inst.uuid} (state={kill.state_before}): "
                        f"{inst.kill_reason}"
                    )
                self.killed(inst, kill.cause, kill.destroyed, self._vast_id(inst, platform))
            self._note_sweep(None)
            return kills

    @staticmethod
    def _vast_id(inst: Instance, platform: Platform | None) -> int | None:
        if platform is not None:
            found = platform.find(inst.label)
            return found.id if found is not None else None
        return vast_id_from_label(inst.label)

    def _note_sweep(self, failure: str | None) -> None:
        with self._lock:
            self._sweeps = {
                "count": self._sweeps["count"] + 1,
                "last_at": rfc3339(time.time()),
                "error": failure,
            }

    def sweeps(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._sweeps)

    def platform(self) -> list[dict[str, Any]] | None:
        if self._platform is None:
            return None
        return [
            {"id": e.id, "label": e.label, "machine_id": e.machine_id}
            for e in self._platform.entries
        ]


# --- the real API's handlers -------------------------------------------------------------
def h_register(app: App, req: Request) -> Response:
    try:
        data = decode_struct(req.body, "RegisterReq", {"label": str, "min_rate": float})
    except BadJSON as exc:
        return bad_request(exc)
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
    try:
        data = decode_struct(req.body, "UUIDReq", {"uuid": str})
    except BadJSON as exc:
        return bad_request(exc)
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
    try:
        data = decode_struct(req.body, "BenchDoneReq", {"uuid": str, "rate": float})
    except BadJSON as exc:
        return bad_request(exc)
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
    try:
        data = decode_struct(req.body, "UUIDReq", {"uuid": str})
    except BadJSON as exc:
        return bad_request(exc)
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


def go_atoi_positive(text: str, default: int) -> int:
    """``strconv.Atoi(text)`` when it is > 0, else ``default`` (the real ``tail`` rule)."""
    if re.fullmatch(r"[+-]?\d+", text):
        value = int(text)
        if 0 < value < 2**63:
            return value
    return default


def h_instance_logs(app: App, req: Request) -> Response:
    parts = req.path.lstrip("/").split("/")
    uuid = ""
    for n, part in enumerate(parts):  # the segment after "instance-logs"; more are ignored
        if part == "instance-logs" and n + 1 < len(parts):
            uuid = parts[n + 1]
            break
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
    try:
        data = decode_struct(req.body, "", {"vast_id": int, "uuid": str})
    except BadJSON as exc:
        return bad_request(exc)
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
    try:
        data = decode_struct(req.body, "DeployReq", {"offer_id": int, "min_rate": float})
    except BadJSON as exc:
        return bad_request(exc)
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
    try:
        data = decode_struct(req.body, "BadHostReq", {"machine_id": str, "reason": str})
    except BadJSON as exc:
        return bad_request(exc)
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
    parts = req.path.lstrip("/").split("/")
    machine_id = ""
    for n, part in enumerate(parts):
        if part == "bad-host" and n + 1 < len(parts):
            machine_id = parts[n + 1]
            break
    if not machine_id:
        return error(400, "machine_id required in path")
    app.store.remove_bad_host(machine_id)
    app.log(f"[bad-host] removed machine_id={machine_id}")
    return ok()


def h_ui(app: App, req: Request) -> Response:
    if req.path != "/":
        return not_found()
    return Response(200, UI_PAGE.encode(), "text/html; charset=utf-8")


# --- /sim/ -------------------------------------------------------------------------------
def h_sim_kill(app: App, req: Request) -> Response:
    try:
        data = decode_struct(req.body, "SimKillReq", {"uuid": str, "reason": str})
    except BadJSON as exc:
        return bad_request(exc)
    inst = app.store.kill(data.get("uuid", ""), data.get("reason", "") or "manual kill")
    if inst is None:
        return sim_response(404, {"error": "instance not found"})
    app.killed(inst, "operator", vast_id_from_label(inst.label) is not None)
    return sim_response(200, {"ok": True, "instance": inst.to_json()})


def h_sim_sweep(app: App, req: Request) -> Response:
    kills = app.sweep()
    return sim_response(
        200,
        {
            "kills": [
                {**k.instance.to_json(), "cause": k.cause, "destroyed": k.destroyed} for k in kills
            ],
            "sweeps": app.sweeps(),
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
            "timeouts": app.timeouts.to_json(),
            "sweeps": app.sweeps(),
            "platform": app.platform(),
            "manager_log_lines": len(app.manager_log.lines()),
            "deploys": app.deploys(),
        },
    )


Handler = Callable[[App, Request], Response]
# As the real server's mux: exact paths, and subtrees (a trailing "/") for the paths that
# carry an id; each handler checks its own method. "/" (the dashboard) takes everything else.
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
    return handler(app, req)


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Counting:
    """A file-like wrapper that counts the bytes read from or written to the socket."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._inner.read(size)
        self.count += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self._inner.readline(size)
        self.count += len(data)
        return data

    def write(self, data: bytes) -> int:
        written: int = self._inner.write(data)
        self.count += len(data)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ManagerRequestHandler(BaseHTTPRequestHandler):
    """Reads one request, asks the fault switches, routes, answers, records it."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Go's server
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK
    server: ManagerHTTPServer
    _in_mark = 0  # bytes read from the connection before this request's line
    _out_mark = 0  # bytes written to it before this request's answer

    def setup(self) -> None:
        super().setup()
        self.rfile = _Counting(self.rfile)  # type: ignore[assignment]
        self.wfile = _Counting(self.wfile)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        self._in_mark = self._read_count()
        super().handle_one_request()

    def _read_count(self) -> int:
        rfile: Any = self.rfile
        return int(rfile.count)

    def _written_count(self) -> int:
        wfile: Any = self.wfile
        return int(wfile.count)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_GET

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
            try:
                self._answer(response)
                entry.answered = True
            finally:
                entry.status = response.status
                entry.duration = time.monotonic() - start
                app.journal.record(entry)
                self._count(app, entry, body=b"")
            return
        entry.body_bytes = len(body)
        if url.path in JSON_PATHS:
            try:
                entry.json = decode_json(body)
            except BadJSON:
                entry.json = None
        req = Request(
            self.command,
            unquote(url.path),
            parse_qs(url.query),
            self.headers,
            body,
            self.connection,
            url.query,
        )
        decision = Decision() if entry.sim else app.faults.decide(url.path)
        if decision.kind == PROXY_KIND and decision.body == RESET:
            self._reset(app, entry, start, body)
            return
        if decision.delay_before > 0:
            time.sleep(decision.delay_before)
        if decision.apply:
            try:
                response = route(app, req)
            except Exception:  # a bug answers 500, the server lives on
                traceback.print_exc(file=sys.stderr)
                response = error(500, "internal error")
            entry.applied = True
            if url.path == "/api/log-push" and response.status == 204:
                entry.lines_stored = len(split_log_body(body))
        if decision.fail:
            entry.faulted = True
            entry.fault = decision.kind
            if decision.kind == ERROR_KIND:
                response = error(decision.status, OUTAGE_MESSAGE)
            else:
                status, canned, content_type = decision.response()
                response = Response(status, canned, content_type, decision.headers())
                if decision.kind == THROTTLE_KIND:
                    value = retry_after_value(
                        decision.retry_after_form, decision.retry_after, time.time()
                    )
                    if value is not None:
                        response.headers["Retry-After"] = value
        if decision.delay_after > 0:
            time.sleep(decision.delay_after)
        entry.status = response.status
        try:
            self._answer(response)
            entry.answered = True
        finally:
            entry.duration = time.monotonic() - start
            app.journal.record(entry)
            self._count(app, entry, body)

    def _reset(self, app: App, entry: JournalEntry, start: float, body: bytes) -> None:
        """A proxy's reset: the connection dropped (RST), nothing answered, nothing applied."""
        entry.faulted, entry.fault, entry.status = True, RESET, 0
        self.close_connection = True
        reset_on_close(self.connection)
        entry.duration = time.monotonic() - start
        app.journal.record(entry)
        self._count(app, entry, body)

    def _count(self, app: App, entry: JournalEntry, body: bytes) -> None:
        """The request in the counters (not a ``/sim/`` one): its bytes both ways, how it was
        answered; a report answered 2xx as applied for its uuid."""
        if entry.sim:
            return
        app.counters.record(
            endpoint_of(entry.path),
            status=entry.status,
            bytes_in=self._read_count() - self._in_mark,
            bytes_out=self._written_count() - self._out_mark,
            faulted=entry.faulted,
            throttled=entry.fault == THROTTLE_KIND,
            applied=entry.applied,
        )
        if entry.applied and entry.path in REPORT_PATHS and 200 <= entry.status < 300:
            uuid = entry.json.get("uuid") if isinstance(entry.json, dict) else None
            if isinstance(uuid, str):
                app.counters.report_applied(entry.path, uuid)

    def _answer(self, response: Response) -> None:
        self._out_mark = self._written_count()
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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cuzk_supervisor.sim.manager",
        description="Simulated fleet manager: the real manager's HTTP API, texts and formats, "
        "with SQLite state, its monitor (timeouts, an optional platform instance list), and "
        "switchable faults (5xx, a proxy's HTML pages, bad 200 bodies, latency, refused "
        "connections).",
    )
    p.add_argument("--db", type=Path, required=True, help="SQLite file (created if missing)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port; port 0 picks a free one")
    p.add_argument("--allow-public", action="store_true", help="allow a non-loopback --listen")
    m = p.add_argument_group(
        "the monitor (every duration divided by --time-scale; seconds, or 250ms, 45m, 1.5h)"
    )
    m.add_argument(
        "--param-timeout",
        type=parse_duration,
        default=DEFAULT_PARAM_TIMEOUT,
        metavar="DURATION",
        help="registered longer than this is killed (default 90m)",
    )
    m.add_argument(
        "--bench-timeout",
        type=parse_duration,
        default=DEFAULT_BENCH_TIMEOUT,
        metavar="DURATION",
        help="params_done longer than this (from param_done_at) is killed (default 45m)",
    )
    m.add_argument(
        "--check-interval",
        type=parse_duration,
        default=DEFAULT_CHECK_INTERVAL,
        metavar="DURATION",
        help="time between two sweeps (default 60s)",
    )
    m.add_argument(
        "--first-check",
        type=parse_duration,
        default=DEFAULT_FIRST_CHECK,
        metavar="DURATION",
        help="time from start to the first sweep (default 10s)",
    )
    m.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="divide the four durations above by F (e.g. 600: 9s, 4.5s, 0.1s, ~17ms); the "
        "kill reasons keep the real texts",
    )
    m.add_argument(
        "--instances",
        type=Path,
        metavar="FILE",
        help="the platform's instance list, read at every sweep: a JSON array of instances "
        "as `vastai show instances --raw` prints them ({id, label, machine_id}) or of ids. "
        "A live record it does not name (by label, then by the id in a C.<digits> label) is "
        "killed with 'instance disappeared from vast'; an unreadable file skips the sweep. "
        "Without it no record disappears",
    )
    g = p.add_argument_group(f"faults (also ${ENV_VAR}; flags win)")
    g.add_argument("--fail-rate", type=float, help="share of requests answered 503 JSON (0..1)")
    g.add_argument("--fail-status", type=int, help="status of a --fail-* answer (default 503)")
    g.add_argument("--fail-next", type=int, help="fail the next N requests")
    g.add_argument(
        "--html-rate",
        type=float,
        help="share of requests a proxy answers with an HTML error page (0..1)",
    )
    g.add_argument(
        "--html-status",
        action="append",
        type=int,
        dest="html_statuses",
        metavar="STATUS",
        help="status of an HTML answer, drawn among those given (repeatable; default 502, 503)",
    )
    g.add_argument(
        "--bad-body-rate",
        type=float,
        help="share of requests answered 200 with a body that is not the expected JSON (0..1)",
    )
    g.add_argument(
        "--bad-body-kind",
        action="append",
        dest="bad_body_kinds",
        choices=BAD_BODY_KINDS,
        help="kind of bad body, drawn among those given (repeatable; default all)",
    )
    g.add_argument(
        "--bad-body-applied",
        action="store_true",
        default=None,
        help="apply a bad-body request before answering (the answer is lost, not the request)",
    )
    g.add_argument(
        "--maintenance-next",
        type=int,
        help="answer the next N requests to --maintenance-path with a 200 HTML 'Down for "
        "maintenance' page",
    )
    g.add_argument("--maintenance-path", help="default /register")
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
    g.add_argument(
        "--throttle-rate",
        type=float,
        help="share of requests a proxy answers --throttle-status with Retry-After (0..1)",
    )
    g.add_argument("--throttle-status", type=int, help="status of a throttled answer (default 429)")
    g.add_argument(
        "--retry-after",
        type=parse_duration,
        metavar="DURATION",
        help="the delay a throttled answer asks for (default 30s)",
    )
    g.add_argument(
        "--retry-after-form",
        choices=RETRY_AFTER_FORMS,
        help="Retry-After as whole seconds (default), an HTTP-date, or no header at all",
    )
    g.add_argument(
        "--throttle-for",
        type=parse_duration,
        metavar="DURATION",
        help="throttle this long from start, then stop (default: as long as the rate is set)",
    )
    g.add_argument(
        "--proxy-rate", type=float,
        help="share of requests a proxy answers with its own page, drawn among --proxy-page (0..1)",
    )  # fmt: skip
    g.add_argument("--proxy-next", type=int, help="the next N requests get a proxy page")
    g.add_argument(
        "--proxy-page", action="append", dest="proxy_pages", metavar="PAGE",
        help="a proxy page: html<status> (html404, html403 …), go404, empty404, json404 or reset "
        "(repeatable; default html404, html403)",
    )  # fmt: skip
    g.add_argument("--seed", type=int, help="seed of the fault RNG (default random, shown)")
    g.add_argument(
        "--refuse-for",
        type=parse_duration,
        metavar="DURATION",
        help="refuse connections for this long from start",
    )
    p.add_argument(
        "--destroy-command",
        help="shell command run when the real manager would destroy a container (env "
        "CUZK_SIM_UUID, CUZK_SIM_LABEL, CUZK_SIM_RUNNER_ID, CUZK_SIM_KILL_REASON, "
        "CUZK_SIM_VAST_ID)",
    )
    v = p.add_argument_group("the platform's CLI (the real manager's deploy path)")
    v.add_argument(
        "--vastai",
        metavar="PROG",
        help="a `vastai` CLI program: POST /api/deploy runs `PROG create instance OFFER ...`, "
        "the sweep reads `PROG show instances --raw` (not with --instances), and a destroyed "
        "container runs `PROG destroy instance ID` (background). Without it /api/deploy "
        "answers 500 'deploy not configured'",
    )
    v.add_argument(
        "--deploy-image",
        default=DEFAULT_IMAGE,
        metavar="IMG",
        help=f"the image /api/deploy starts (default {DEFAULT_IMAGE}, the real manager's)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    return p


FAULT_FLAGS = (
    "fail_rate",
    "fail_status",
    "fail_next",
    "html_rate",
    "html_statuses",
    "bad_body_rate",
    "bad_body_kinds",
    "bad_body_applied",
    "maintenance_next",
    "maintenance_path",
    "paths",
    "latency",
    "latency_phase",
    "throttle_rate",
    "throttle_status",
    "retry_after",
    "retry_after_form",
    "throttle_for",
    "proxy_rate",
    "proxy_next",
    "proxy_pages",
    "seed",
    "refuse_for",
)


def fault_settings(
    args: argparse.Namespace, env: dict[str, str]
) -> tuple[FaultSettings, float, float]:
    """Environment, then flags; returns the settings, the start's refuse window and its
    throttle window (0: none)."""
    changes = parse_text(env.get(ENV_VAR, ""))
    flags = {name: getattr(args, name) for name in FAULT_FLAGS}
    changes.update(validate({k: v for k, v in flags.items() if v is not None}))
    refuse_for = float(changes.pop("refuse_for", 0.0))
    throttle_for = float(changes.pop("throttle_for", 0.0))
    return FaultSettings(**changes), refuse_for, throttle_for


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _monitor_loop(app: App, stop: threading.Event) -> None:
    """First sweep after ``first_check``, then one every ``check_interval``."""
    wait = app.timeouts.first_check
    while not stop.wait(wait):
        try:
            app.sweep()
        except Exception:  # the next tick tries again
            traceback.print_exc(file=sys.stderr)
        wait = app.timeouts.check_interval


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        host, port, family = parse_listen(args.listen, args.allow_public)
        settings, refuse_for, throttle_for = fault_settings(args, dict(os.environ))
        if args.check_interval <= 0:
            raise UsageError("--check-interval must be > 0")
        if args.vastai and args.instances is not None:
            raise UsageError("--vastai and --instances exclude each other")
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
    timeouts = Timeouts.scaled(
        args.param_timeout,
        args.bench_timeout,
        args.check_interval,
        args.first_check,
        args.time_scale,
    )
    app = App(
        store,
        Faults(settings, throttle_for),
        timeouts,
        say,
        args.destroy_command,
        args.verbose,
        args.instances,
        VastCLI(args.vastai, args.deploy_image) if args.vastai else None,
    )
    server = ManagerHTTPServer((host, port), ManagerRequestHandler, app, family)
    listener = Listener(server, host, port, say)
    app.listener = listener
    try:
        listener.start(refuse_for)
    except OSError as exc:
        sys.stderr.write(f"sim-manager: cannot bind {args.listen}: {exc}\n")
        store.close()
        return EXIT_START
    app.log(f"API server listening on {listener.url.removeprefix('http://')}")
    monitor = threading.Thread(target=_monitor_loop, args=(app, stop), name="monitor", daemon=True)
    monitor.start()
    while not stop.wait(1.0):
        pass
    listener.stop()
    monitor.join(timeout=5)
    store.close()
    say("sim-manager stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
