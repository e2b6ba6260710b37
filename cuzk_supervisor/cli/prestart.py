"""Everything ``run`` (and ``sim``) can refuse before anything starts: exit 2, nothing half-done.

Called before ``/register``, before a folder is made, a file written or a child started. The
settings' own bounds are checked when they are loaded (``settings.load``); here come the inputs
they point at — the C1 file, the daemon base config — and the values read from the platform's
environment (``VAST_CONTAINERLABEL``, ``MIN_RATE``). Pure apart from reading those files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

from cuzk_supervisor import settings
from cuzk_supervisor.adapters.inputfile import read_toml
from cuzk_supervisor.adapters.proofinput import load_c1
from cuzk_supervisor.daemon.config import DaemonConfigValues, render
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.serve.endpoint import check_listen
from cuzk_supervisor.settings import Settings

# An operator's daemon config is a page of TOML; a megabyte is not one.
MAX_BASE_CONFIG_BYTES = 1 << 20


def check_base_config(path: Path | None) -> dict[str, Any]:
    """The daemon base config parsed and checked: UTF-8 TOML whose tables we merge into are
    tables, and which renders to a file the daemon can read (one-line UsageError otherwise)."""
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
    """The label and minimum rate the platform gives when the settings leave them empty are held
    to the settings' own rules."""
    if not s.label and environ.get("VAST_CONTAINERLABEL", "").strip():
        raw = environ["VAST_CONTAINERLABEL"].strip()
        settings.parse_value(_declared("label"), raw, "env VAST_CONTAINERLABEL")
    if not s.min_rate and environ.get("MIN_RATE", "").strip():
        settings.parse_value(_declared("min_rate"), environ["MIN_RATE"].strip(), "env MIN_RATE")


def check_before_start(s: Settings, environ: Mapping[str, str]) -> list[str]:
    """Refuse (UsageError) what would fail later; return the warnings to log once logging is
    configured (a public daemon address the operator allowed)."""
    check_platform_environment(s, environ)
    load_c1(s.c1_file)  # size (stat first), UTF-8, JSON, the PoRep envelope
    check_base_config(s.daemon_base_config)
    if s.health_enabled:
        check_listen(s.health_listen, allow_public=s.health_allow_public)
    warnings = []
    for name in ("daemon_listen", "daemon_status_listen"):
        warning = settings.public_listen_warning(s, name)
        if warning is not None:
            warnings.append(warning)
    return warnings
