"""Where the health server listens and what it serves: the listen-address rule (an IP address
and a port, loopback unless ``health_allow_public``) and the route names.

No server and no metrics here: the settings, the prestart checks and the
``healthcheck`` command import this to check or reach the address without loading the server.
"""

from __future__ import annotations

import ipaddress

from cuzk_supervisor.address import check_public
from cuzk_supervisor.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9822"
ROUTES = ("/healthz", "/startupz", "/readyz", "/metrics")


class HealthServerError(UsageError):
    """The health server cannot listen where it was told to (bad, public or busy address)."""


def parse_listen(text: str) -> tuple[str, int]:
    """``ip:port`` or ``[ipv6]:port`` -> (ip, port); port 0 asks the kernel for a free one."""
    raw = text.strip()
    host, sep, port_text = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host:
        raise HealthServerError(
            f"bad health_listen {text!r}: expected ip:port, e.g. {DEFAULT_LISTEN}"
        )
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise HealthServerError(
            f"bad health_listen {text!r}: {host!r} is not an IP address (no host names)"
        ) from None
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise HealthServerError(f"bad health_listen {text!r}: port must be 0-65535")
    return str(ip), int(port_text)


def check_listen(listen: str, *, allow_public: bool = False) -> tuple[str, int]:
    """``parse_listen`` plus the loopback rule; binds nothing, so a command can refuse a bad
    setting before it starts anything."""
    host, port = parse_listen(listen)
    # The metrics name the machine's GPUs and its state; nothing here is for the world.
    check_public(
        "health_listen",
        listen,
        is_loopback=ipaddress.ip_address(host).is_loopback,
        allow_public=allow_public,
        allow_setting="health_allow_public",
        error=HealthServerError,
    )
    return host, port
