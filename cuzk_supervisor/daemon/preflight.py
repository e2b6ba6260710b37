"""What can be known about a daemon start before it is tried: can the binary run, is the
address free. Used by the start itself, by ``run``'s checks before anything starts
(``cli.prestart``) and by ``doctor``.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

from cuzk_supervisor.address import Address


def resolve_binary(binary: str) -> tuple[str | None, str]:
    """The executable's path, or None and the one-line reason it cannot be run."""
    if os.sep in binary:
        path = Path(binary)
        if not path.exists():
            return None, f"daemon binary {binary} not found"
        if path.is_dir() or not os.access(path, os.X_OK):
            return None, f"daemon binary {binary} is not executable"
        return str(path), ""
    found = shutil.which(binary)
    if found is None:
        return None, f"daemon binary {binary!r} not found on PATH"
    return found, ""


def address_in_use(address: Address) -> bool:
    """Whether something already listens where the daemon should (checked before spawning)."""
    if address.path is not None:
        if not address.path.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            try:
                probe.connect(str(address.path))
            except OSError:
                return False  # a stale socket file: the daemon removes it at start
            return True
    error = tcp_bind_error(address)
    return error is not None and error.errno == errno.EADDRINUSE


def tcp_bind_error(address: Address) -> OSError | None:
    """What binding the TCP ``address`` now raises (None: it binds), as the daemon would."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address.host, address.port))
        except OSError as exc:
            return exc
    return None
