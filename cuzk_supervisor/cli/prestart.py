"""Everything ``run`` (and ``sim``) can refuse before anything starts: exit 2, nothing half-done.

Called before ``/register``. The settings' own bounds are checked by ``settings.load``; here
come the files they point at (the C1 envelope, the daemon base config), the platform's
``VAST_CONTAINERLABEL`` and ``MIN_RATE``, and what the machine must offer before the slow phases:
a daemon binary that runs, folders writable or makeable (looked at, never made), room on the
param cache's disk (``doctor``'s figures), and what ``compose.Machine.check`` refuses (the
simulator's fault switches and machine). Reads files; writes nothing.
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.inputfile import read_toml
from cuzk_supervisor.adapters.proving.proofinput import load_c1
from cuzk_supervisor.adapters.state.doc import SupervisorState
from cuzk_supervisor.address import parse_address

# Shared with doctor, from their own light module: the doctor package loads httpx.
from cuzk_supervisor.cli.looks import STATE_FILE as STATE_FILE  # run's state file
from cuzk_supervisor.cli.looks import (
    DiskUsage,
    could_create_in,
    nearest_existing,
    param_cache_need,
    previous_state,
    writable,
)
from cuzk_supervisor.core.units import fmt_bytes
from cuzk_supervisor.daemon.config import DaemonConfigValues, render
from cuzk_supervisor.daemon.preflight import resolve_binary
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.serve.endpoint import check_listen
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import daemon_listen

if TYPE_CHECKING:
    from cuzk_supervisor.compose import Machine

# An operator's daemon config is a page of TOML; a megabyte is not one.
MAX_BASE_CONFIG_BYTES = 1 << 20
# The folders the run writes in, in the order a person fixes them.
FOLDERS = ("daemon_param_cache", "state_dir", "run_dir", "log_dir")


def check_base_config(path: Path | None) -> dict[str, Any]:
    """UTF-8 TOML whose tables we merge into are tables, and which renders back."""
    if path is None:
        return {}
    base = read_toml(path, what="daemon base config", max_bytes=MAX_BASE_CONFIG_BYTES)
    probe = DaemonConfigValues(
        partition_workers=1, total_budget_gib=1, max_parallel_synthesis=1, listen="127.0.0.1:1"
    )
    for table in probe.owned():
        if table in base and not isinstance(base[table], dict):
            raise UsageError(
                f"daemon base config {path}: {table} must be a table ([{table}]), "
                f"not {type(base[table]).__name__}"
            )
    try:
        tomli_w.dumps(render(probe, base))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"daemon base config {path} cannot be written back: {exc}") from None
    return base


def _declared(name: str) -> settings.Declared:
    return next(decl for decl in settings.declarations() if decl.name == name)


def check_platform_environment(s: Settings, environ: Mapping[str, str]) -> None:
    """The platform's label and minimum rate (read when the settings leave them empty)."""
    if not s.label and environ.get("VAST_CONTAINERLABEL", "").strip():
        raw = environ["VAST_CONTAINERLABEL"].strip()
        settings.parse_value(_declared("label"), raw, "env VAST_CONTAINERLABEL")
    if not s.min_rate and environ.get("MIN_RATE", "").strip():
        settings.parse_value(_declared("min_rate"), environ["MIN_RATE"].strip(), "env MIN_RATE")


def check_input_files(s: Settings) -> dict[str, Any]:
    """The C1 envelope and the daemon base config (returned), each refused as its setting."""
    name = "c1_file"
    try:
        load_c1(s.c1_file)
        name = "daemon_base_config"
        return check_base_config(s.daemon_base_config)
    except UsageError as exc:
        raise UsageError(f"setting {name}: {exc}") from None


def check_daemon_socket(s: Settings) -> None:
    """With daemon_listen empty the daemon's socket is in run_dir: held to the kernel's limit."""
    if s.daemon_listen:
        return  # checked with the settings
    try:
        parse_address(daemon_listen(s))
    except UsageError as exc:
        raise UsageError(f"setting run_dir: the daemon's socket in it: {exc}") from None


def check_binary(s: Settings) -> None:
    resolved, reason = resolve_binary(s.daemon_binary)
    if resolved is None:
        raise UsageError(f"setting daemon_binary: {reason}")


def folder_problem(path: Path) -> str | None:
    """Why the run could not write in ``path`` or make it (None: it could). Looks only."""
    path = path.absolute()
    if path.exists():
        if not path.is_dir():
            return f"{path} is not a folder"
        if writable(path):
            return None
        if path.stat().st_mode & stat.S_IWOTH:  # and its mode cannot be fixed either
            return f"{path} is not writable, and world-writable (read-only: cannot be fixed)"
        return f"{path} is not writable"
    parent = nearest_existing(path)
    problem = could_create_in(parent)
    return None if problem is None else f"{path} cannot be made ({problem})"


def check_folders(s: Settings) -> None:
    for name in FOLDERS:
        problem = folder_problem(getattr(s, name))
        if problem is not None:
            raise UsageError(f"setting {name}: {problem}")


def disk_needed(s: Settings, previous: SupervisorState | None) -> int:
    """Free bytes the param cache's file system needs (``looks.param_cache_need``)."""
    return param_cache_need(s, previous).total_bytes


def check_disk(s: Settings, disk_usage: Callable[[Path], DiskUsage] = shutil.disk_usage) -> None:
    """Room for the parameters and PCE files, before a download that can take an hour."""
    checked = nearest_existing(s.daemon_param_cache)
    try:
        free = int(disk_usage(checked).free)
    except OSError:
        return  # cannot be read here: the fetch and the daemon will say what is wrong
    need = disk_needed(s, previous_state(s))
    if free < need:
        raise UsageError(
            f"setting daemon_param_cache: only {fmt_bytes(free)} free at {checked}, the "
            f"parameters and PCE files need {fmt_bytes(need)} (free some space or point it at a "
            "bigger disk)"
        )


def check_before_start(
    s: Settings,
    environ: Mapping[str, str],
    *,
    disk_usage: Callable[[Path], DiskUsage] = shutil.disk_usage,
    machine: Machine | None = None,
) -> list[str]:
    """Refuse (UsageError) what would fail later; return the warnings to log once logging is
    configured (a public daemon address the operator allowed). Last, what ``machine`` refuses."""
    check_platform_environment(s, environ)
    check_input_files(s)
    check_daemon_socket(s)
    if s.health_enabled:
        check_listen(s.health_listen, allow_public=s.health_allow_public)
    check_binary(s)
    check_folders(s)
    check_disk(s, disk_usage)
    if machine is not None:
        machine.check(s)
    names = ("daemon_listen", "daemon_status_listen")
    warnings = (settings.public_listen_warning(s, name) for name in names)
    return [warning for warning in warnings if warning is not None]
