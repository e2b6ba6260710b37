"""The simulated manager's command line: its flags (the database, the listening address, the
monitor's durations and ``--time-scale``, the platform's list or CLI, the fault switches), the
durations they take (``90``, ``250ms``, ``45m``, ``1.5h``), the listening address (loopback
unless allowed), and the fault settings from ``CUZK_SIM_MANAGER_FAULTS`` and the flags (flags
win).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from pathlib import Path

from cuzk_supervisor.sim.manager.faults import (
    ENV_VAR,
    RETRY_AFTER_FORMS,
    FaultSettings,
    parse_text,
    validate,
)
from cuzk_supervisor.sim.manager.proxy import BAD_BODY_KINDS
from cuzk_supervisor.sim.manager.sweep import (
    DEFAULT_BENCH_TIMEOUT,
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_FIRST_CHECK,
    DEFAULT_PARAM_TIMEOUT,
)
from cuzk_supervisor.sim.manager.vast import DEFAULT_IMAGE

DEFAULT_LISTEN = "127.0.0.1:8090"


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
