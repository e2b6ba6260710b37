"""The daemon's TOML config, read the way the real daemon reads it (quirks included).

Unknown keys are ignored and a missing file means all defaults, silently. A value of the wrong
type is an error (serde would refuse it). Sizes take only ``GiB``/``MiB``/``GB``/``MB`` suffixes
or plain bytes; anything else (``"256G"``) silently becomes 50 GiB, as in the budget release.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_CONFIG = Path("/data/zk/cuzk.toml")
DEFAULT_LISTEN = "unix:///run/curio/cuzk.sock"
DEFAULT_PARAM_CACHE = Path("/data/zk/params")
UNPARSABLE_SIZE_FALLBACK = 50 * GIB
DEFAULT_SAFETY_MARGIN = 5 * GIB
_UNITS = {"GiB": GIB, "MiB": MIB, "GB": 10**9, "MB": 10**6, "": 1}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|MiB|GB|MB|)\s*$")


class ConfigError(Exception):
    """The file exists but cannot be used (bad TOML, a value of the wrong type)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    found: bool = False
    partition_workers: int = 20
    total_budget_bytes: int = 0
    total_budget_text: str = "auto"
    safety_margin_bytes: int = DEFAULT_SAFETY_MARGIN
    max_parallel_synthesis: int = 18
    param_cache: Path = DEFAULT_PARAM_CACHE
    preload: tuple[str, ...] = ()
    listen: str = DEFAULT_LISTEN
    status_listen: str | None = None
    gpu_workers_per_device: int = 2
    devices: tuple[int, ...] = ()
    log_level: str = "info"


def parse_size(value: str | int) -> int | None:
    """Bytes for ``"128GiB"``, ``"512 MiB"``, ``"100GB"``, ``"1048576"`` or 1048576; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    match = _SIZE_RE.match(value)
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def mem_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Host MemTotal. The real daemon reads only this: cgroup limits are NOT consulted."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ConfigError(f"no MemTotal in {meminfo}")


def _get(table: dict[str, Any], section: str, key: str, kind: Any, default: Any) -> Any:
    sect = table.get(section, {})
    if not isinstance(sect, dict) or key not in sect:
        return default
    value = sect[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        expected = getattr(kind, "__name__", str(kind))
        raise ConfigError(f"invalid type for {section}.{key}: expected {expected}")
    return value


def parse_config(data: dict[str, Any], mem_total: int, found: bool = True) -> SimConfig:
    """Config from parsed TOML; ``mem_total`` is MemTotal in bytes (used by ``auto``)."""
    margin_raw = _get(data, "memory", "safety_margin", str | int, "5GiB")
    margin = parse_size(margin_raw)
    margin = DEFAULT_SAFETY_MARGIN if margin is None else margin
    budget_raw = _get(data, "memory", "total_budget", str | int, "auto")
    if budget_raw == "auto":
        budget = max(0, mem_total - margin)
    else:
        parsed = parse_size(budget_raw)
        budget = UNPARSABLE_SIZE_FALLBACK if parsed is None else parsed
    preload = _get(data, "srs", "preload", list, [])
    devices = _get(data, "gpus", "devices", list, [])
    if not all(isinstance(x, str) for x in preload):
        raise ConfigError("invalid type for srs.preload: expected a list of strings")
    if not all(isinstance(x, int) for x in devices):
        raise ConfigError("invalid type for gpus.devices: expected a list of integers")
    return SimConfig(
        found=found,
        partition_workers=_get(data, "synthesis", "partition_workers", int, 20),
        total_budget_bytes=budget,
        total_budget_text=str(budget_raw),
        safety_margin_bytes=margin,
        max_parallel_synthesis=_get(data, "pipeline", "max_parallel_synthesis", int, 18),
        param_cache=Path(_get(data, "srs", "param_cache", str, str(DEFAULT_PARAM_CACHE))),
        preload=tuple(preload),
        listen=_get(data, "daemon", "listen", str, DEFAULT_LISTEN),
        status_listen=_get(data, "daemon", "status_listen", str, None),
        gpu_workers_per_device=_get(data, "gpus", "gpu_workers_per_device", int, 2),
        devices=tuple(devices),
        log_level=_get(data, "logging", "level", str, "info"),
    )


def load_config(
    path: Path, meminfo: Path = Path("/proc/meminfo"), *, mem_total: int | None = None
) -> SimConfig:
    """Read ``path``; a missing file silently gives the defaults, as the real daemon does.
    ``mem_total`` replaces MemTotal (the simulated machine's RAM, ``--host-gib``)."""
    total = mem_total if mem_total is not None else mem_total_bytes(meminfo)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return parse_config({}, total, found=False)
    except OSError as exc:
        raise ConfigError(f"failed to read config {path}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"failed to parse config {path}: {exc}") from exc
    return parse_config(data, total)
