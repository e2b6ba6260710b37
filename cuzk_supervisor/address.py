"""Listen/dial addresses as the cuzk daemon takes them: ``ip:port`` or ``unix:///path``.

The real daemon accepts no host names and no scheme on TCP, so neither do we: a bad address is
caught here, before anything is started.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.errors import UsageError

UNIX_SCHEME = "unix://"
# sockaddr_un.sun_path is 108 bytes on Linux, the terminating NUL included: a longer path
# cannot be bound (the daemon would fail at every start: a crash loop, not a run).
MAX_UNIX_PATH_BYTES = 107


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed daemon address: exactly one of ``path`` (unix socket) or ``host``+``port``."""

    host: str = ""
    port: int = 0
    path: Path | None = None

    @property
    def is_unix(self) -> bool:
        return self.path is not None

    @property
    def is_loopback(self) -> bool:
        return self.is_unix or ipaddress.ip_address(self.host).is_loopback

    def grpc_target(self) -> str:
        """The target string grpc's channel wants."""
        if self.path is not None:
            return f"unix://{self.path}"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        """The form the daemon's ``--listen`` flag takes (round-trips through ``parse_address``)."""
        return self.grpc_target()


def parse_address(text: str) -> Address:
    """Parse ``ip:port``, ``[ipv6]:port`` or ``unix:///abs/path``; raise UsageError otherwise."""
    raw = text.strip()
    if raw.startswith(UNIX_SCHEME):
        path = raw[len(UNIX_SCHEME) :]
        if not path.startswith("/"):
            raise UsageError(
                f"bad address {text!r}: a unix socket needs an absolute path, "
                "as in unix:///run/cuzk.sock"
            )
        size = len(path.encode("utf-8", "surrogateescape"))
        if size > MAX_UNIX_PATH_BYTES:
            raise UsageError(
                f"bad address {text[:60]!r}: a unix socket path of {size} bytes, over the "
                f"kernel's limit of {MAX_UNIX_PATH_BYTES}"
            )
        return Address(path=Path(path))
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host:
        raise UsageError(f"bad address {text!r}: expected ip:port or unix:///path")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(
            f"bad address {text!r}: {host!r} is not an IP address (the daemon takes no host names)"
        ) from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"bad address {text!r}: port must be 1-65535")
    return Address(host=str(ip), port=int(port_text))


def check_public(
    setting: str,
    listen: str,
    *,
    is_loopback: bool,
    allow_public: bool,
    allow_setting: str,
    error: type[UsageError] = UsageError,
) -> str | None:
    """The one rule for every listener we start or configure: loopback (or a unix socket) only,
    unless the operator set ``allow_setting``. Raises ``error`` when refused; returns the
    warning to log when a public address is allowed, None for a loopback one."""
    if is_loopback:
        return None
    if not allow_public:
        raise error(
            f"{setting} {listen!r} is not a loopback address; nothing listens beyond loopback "
            f"(or a unix socket) unless {allow_setting} is set"
        )
    return f"{setting} {listen!r} is reachable from the network ({allow_setting} is set)"


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for demos and tests; racy by nature)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
