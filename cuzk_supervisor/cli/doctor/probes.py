"""Doctor's probes of the machine: folders, addresses, and ``Probes``, the edges tests replace.

Doctor only looks. A folder that exists is tried with a temp file made and removed at once; one
that does not exist yet is not made: its nearest existing parent is asked (``access(2)``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cuzk_supervisor.adapters.machine.gpu import GpuProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler
from cuzk_supervisor.address import Address
from cuzk_supervisor.cli.doctor.judges import FolderFacts
from cuzk_supervisor.cli.doctor.results import UNIX_PATH_MAX
from cuzk_supervisor.cli.looks import STATE_FILE as STATE_FILE
from cuzk_supervisor.cli.looks import DiskUsage, could_create_in
from cuzk_supervisor.cli.looks import nearest_existing as nearest_existing
from cuzk_supervisor.cli.looks import param_cache_need as param_cache_need
from cuzk_supervisor.cli.looks import previous_state as previous_state
from cuzk_supervisor.compose import HOST, Machine
from cuzk_supervisor.daemon.preflight import address_in_use, tcp_bind_error
from cuzk_supervisor.daemon.preflight import resolve_binary as _resolve_binary
from cuzk_supervisor.settings import Settings

# The looks above are shared with the check before ``run`` (``cli.prestart``), which must not
# load this package: they live in ``cli.looks`` and are re-exported here.


def os_error_text(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({exc.filename})" if exc.filename and exc.strerror else text


def try_write(folder: Path) -> None:
    """Create and delete a temp file in ``folder``; OSError when that is not possible."""
    fd, name = tempfile.mkstemp(prefix=".cuzk-doctor-", dir=folder)
    os.close(fd)
    os.unlink(name)


def probe_folder(path: Path) -> FolderFacts:
    """Whether the run can write in ``path`` (or make it)."""
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
    error = tcp_bind_error(address)
    if error is None:
        return None
    if error.errno == errno.EADDRINUSE:
        return "in use by another process"
    return f"cannot bind: {os_error_text(error)}"


@dataclass(frozen=True)
class Probes:
    """The machine's edges; tests replace any of them. GPUs and memory: a ``compose.Machine``'s."""

    gpu_probe: Callable[[Settings], GpuProbe] = HOST.gpu_probe
    memory_sampler: Callable[[Settings], MemorySampler] = HOST.memory_sampler
    disk_usage: Callable[[Path], DiskUsage] = shutil.disk_usage
    resolve_binary: Callable[[str], tuple[str | None, str]] = _resolve_binary
    listen_problem: Callable[[Address], str | None] = listen_problem
    http_transport: httpx.BaseTransport | None = None
    clock: Callable[[], float] = field(default=time.monotonic)

    @classmethod
    def of(cls, machine: Machine) -> Probes:
        return cls(gpu_probe=machine.gpu_probe, memory_sampler=machine.memory_sampler)
