"""``cuzk-supervisor healthcheck``: ask the running supervisor's health server, in one line.

The container's HEALTHCHECK. The address is the ``health_listen`` setting, read exactly as
``run`` and ``sim`` read it (flag > ``CUZK_SUPERVISOR_HEALTH_LISTEN`` > config file > default), so
the probe follows wherever the server was told to listen; a wildcard address (``0.0.0.0``,
``::``) is asked on loopback. Exit 0 when the endpoint answers 200, else 1 with one line saying
why (refused, timed out, the server's own reason, the server turned off, a bad setting); never
a traceback. Docker keeps that line in ``docker inspect``'s health log.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

from cuzk_supervisor import settings
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.serve.endpoint import ROUTES, parse_listen

HEALTHY = 0
UNHEALTHY = 1  # Docker's HEALTHCHECK: 0 healthy, 1 unhealthy (2 is reserved)
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "healthcheck",
        help="probe the running supervisor's health server (the container's HEALTHCHECK)",
        description=__doc__,
    )
    probe = parser.add_argument_group("probe")
    probe.add_argument(
        "--path",
        default="/healthz",
        choices=ROUTES,
        metavar="PATH",
        help=f"endpoint to ask: {', '.join(ROUTES)} (default: /healthz)",
    )
    probe.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the answer (default: 5)",
    )
    settings.add_flags(parser, names=("health_enabled", "health_listen"))
    parser.set_defaults(handler=main)


def probe_url(listen: str, path: str = "/healthz") -> str:
    host, port = parse_listen(listen)
    host = WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def _reason(body: bytes) -> str:
    """The server's own words: a JSON body's reason (or the body), one line, short."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        text = str(doc.get("reason") or doc.get("last_failure") or text)
    return " ".join(text.split())[:300]


def check(listen: str, path: str = "/healthz", timeout_s: float = 5.0) -> tuple[bool, str]:
    """(healthy, one line)."""
    url = probe_url(listen, path)
    # No proxy from the environment between a probe and loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as answer:
            body = answer.read(4096)
            return True, f"healthy: GET {url}: {answer.status} {_reason(body)}"
    except urllib.error.HTTPError as exc:
        return False, f"unhealthy: GET {url}: {exc.code} {_reason(exc.read(4096))}"
    except urllib.error.URLError as exc:
        why = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
        return False, f"unhealthy: GET {url}: {why or exc.reason}"
    except TimeoutError:
        return False, f"unhealthy: GET {url}: no answer within {timeout_s:g}s"
    except OSError as exc:
        return False, f"unhealthy: GET {url}: {exc.strerror or exc}"


def main(args: argparse.Namespace) -> int:
    try:
        s = settings.from_namespace(args).settings
        if not s.health_enabled:
            print("unhealthy: the health server is off (health_enabled=false)")
            return UNHEALTHY
        healthy, line = check(s.health_listen, args.path, args.timeout)
    except UsageError as exc:
        print(f"unhealthy: {' '.join(str(exc).split())}")
        return UNHEALTHY
    print(line)
    return HEALTHY if healthy else UNHEALTHY
