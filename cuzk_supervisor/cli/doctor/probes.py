"""Doctor's probes of the machine: folders, addresses, the param cache's disk need (shared with
the check before ``run``), and ``Probes``, the edges tests replace.

Doctor only looks. A folder that exists is tried with a temp file made and removed at once; a
folder that does not exist yet is not made: its nearest existing parent is asked whether it
could be (``access(2)``: write and search permission, a read-only mount). Nothing is left behind.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from cuzk_supervisor.adapters.gpu import GpuProbe
from cuzk_supervisor.adapters.params import ExpectedFile, file_sizes, parse_expected
from cuzk_supervisor.adapters.resources import MemorySampler
from cuzk_supervisor.adapters.statedoc import SupervisorState
from cuzk_supervisor.address import Address
from cuzk_supervisor.cli.doctor.judges import FolderFacts
from cuzk_supervisor.cli.doctor.results import UNIX_PATH_MAX
from cuzk_supervisor.core.disk import DiskNeed, disk_need
from cuzk_supervisor.daemon.preflight import address_in_use
from cuzk_supervisor.daemon.preflight import resolve_binary as _resolve_binary
from cuzk_supervisor.lifecycle import assemble
from cuzk_supervisor.settings import Settings

STATE_FILE = "state.json"
"""The state file in ``state_dir`` (``run`` keeps it there)."""
MAX_STATE_BYTES = 16 << 20


class DiskUsage(Protocol):
    @property
    def free(self) -> int: ...


def os_error_text(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({exc.filename})" if exc.filename and exc.strerror else text


def nearest_existing(path: Path) -> Path:
    """``path`` if it exists, else its closest existing ancestor."""
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or "/")


def try_write(folder: Path) -> None:
    """Create and delete a temp file in ``folder``; raises OSError when that is not possible."""
    fd, name = tempfile.mkstemp(prefix=".cuzk-doctor-", dir=folder)
    os.close(fd)
    os.unlink(name)


def could_create_in(parent: Path) -> str | None:
    """Why a folder could not be made below ``parent`` (an existing path); None: it could."""
    if not parent.is_dir():
        return f"{parent}: {os.strerror(errno.ENOTDIR)}"
    if not os.access(
        parent, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids
    ):
        return f"{parent}: not writable"
    return None


def probe_folder(path: Path) -> FolderFacts:
    """Whether the run can write in ``path`` (or make it): looks, makes nothing."""
    if path.is_dir():
        try:
            try_write(path)
        except OSError as exc:
            return FolderFacts(path, True, path, os_error_text(exc))
        return FolderFacts(path, True, path)
    if path.exists():
        return FolderFacts(path, True, path, os.strerror(errno.ENOTDIR))
    parent = nearest_existing(path)
    return FolderFacts(path, False, parent, could_create_in(parent))


def previous_state(s: Settings) -> SupervisorState | None:
    """The state a previous run left (read only; anything unusable is as good as none: the
    run itself moves a bad file aside and starts afresh)."""
    path = s.state_dir / STATE_FILE
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_STATE_BYTES:
            return None
        return SupervisorState.from_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    except Exception:  # any malformed document (StateFormatError and what validation raises)
        return None


def present_param_bytes(cache: Path, expected: Sequence[ExpectedFile]) -> int:
    """Bytes of the ``expected`` parameter files already in ``cache`` at full size (0 when the
    cache is not a folder yet). Looks only: one ``stat`` a file."""
    if not expected or not cache.is_dir():
        return 0
    sizes = file_sizes(cache, expected)
    return sum(f.size for f in expected if sizes.get(f.name) == f.size)


def param_cache_need(s: Settings, previous: SupervisorState | None) -> DiskNeed:
    """What the param cache's file system must still take (``core.disk.disk_need``): the
    parameters not there yet and the PCE files, less what a previous run of this instance
    already wrote (parameters verified, PCE files built), in the simulator's sizes when
    ``plan_memory_scale`` is not 1. ``doctor`` and the check before ``run`` both judge by it."""
    verified = previous is not None and previous.params_verified
    present = 0
    if not verified:
        expected = parse_expected(s.params_expected)
        present = present_param_bytes(s.daemon_param_cache.absolute(), expected)
    return disk_need(
        present,
        pce_built=previous is not None and previous.pce_ready,
        params_verified=verified,
        scale=s.plan_memory_scale,
    )


def listen_problem(address: Address) -> str | None:
    """Why the daemon (or our health server) could not listen at ``address``; None: it can."""
    if address.path is not None:
        if len(os.fsencode(address.path)) > UNIX_PATH_MAX:
            return (
                f"socket path is {len(os.fsencode(address.path))} bytes, more than the "
                f"{UNIX_PATH_MAX} the kernel binds"
            )
        if address_in_use(address):
            return "in use: a process answers on that socket"
        folder = probe_folder(address.path.parent)
        if folder.error is not None:
            return f"socket folder {folder.path} is not writable: {folder.error}"
        return None
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use by another process"
            return f"cannot bind: {os_error_text(exc)}"
    return None


@dataclass(frozen=True)
class Probes:
    """The machine's edges; tests replace any of them."""

    gpu_probe: Callable[[Settings], GpuProbe] = assemble.gpu_probe
    memory_sampler: Callable[[Settings], MemorySampler] = assemble.memory_sampler
    disk_usage: Callable[[Path], DiskUsage] = shutil.disk_usage
    resolve_binary: Callable[[str], tuple[str | None, str]] = _resolve_binary
    listen_problem: Callable[[Address], str | None] = listen_problem
    http_transport: httpx.BaseTransport | None = None
    clock: Callable[[], float] = field(default=time.monotonic)
