"""The daemon's TOML config: render it from a plan, merge the operator's base file, verify it.

Both daemon releases must obey the plan: the workers release reads ``partition_workers``, the
budget release ``total_budget`` and ``max_parallel_synthesis``. The budget release silently turns
a size it cannot parse (``"256G"``) into 50 GiB and its ``"auto"`` reads the host's RAM, not the
container's, so we always write an explicit ``"<n>GiB"`` and read the file back before use.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from cuzk_supervisor.adapters import files
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.errors import UsageError

_GIB_FORM = re.compile(r"^[1-9][0-9]*GiB$")


@dataclass(frozen=True, slots=True)
class DaemonConfigValues:
    """Every value we own in the daemon's config file."""

    partition_workers: int
    total_budget_gib: int
    max_parallel_synthesis: int
    listen: str
    status_listen: str = "127.0.0.1:9821"
    param_cache: str = "/data/zk/params"
    log_level: str = "info"
    preload: tuple[str, ...] = field(default=("porep-32g",))

    def __post_init__(self) -> None:
        for name in ("partition_workers", "total_budget_gib", "max_parallel_synthesis"):
            if getattr(self, name) < 1:
                raise UsageError(f"daemon config: {name} must be >= 1, got {getattr(self, name)}")
        parse_address(self.listen)
        parse_address(self.status_listen)

    def owned(self) -> dict[str, dict[str, Any]]:
        """Our keys, as TOML tables. These win over the operator's base file."""
        return {
            "daemon": {"listen": self.listen, "status_listen": self.status_listen},
            "synthesis": {"partition_workers": self.partition_workers},
            "memory": {"total_budget": f"{self.total_budget_gib}GiB"},
            "pipeline": {"max_parallel_synthesis": self.max_parallel_synthesis},
            "srs": {"param_cache": self.param_cache, "preload": list(self.preload)},
            "logging": {"level": self.log_level},
        }


def merge(base: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge tables: the base's other keys are kept, ours win where both set a key."""
    merged: dict[str, Any] = dict(base)
    for key, value in ours.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_base(path: Path | None) -> dict[str, Any]:
    """The operator's base config; a missing or broken file is an error, never 'defaults'."""
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"daemon base config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"daemon base config {path} is not valid TOML: {exc}") from None


def render(values: DaemonConfigValues, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return merge(base or {}, values.owned())


def check(document: Mapping[str, Any], values: DaemonConfigValues) -> list[str]:
    """Differences between a config document and the values it must carry (empty when good)."""
    problems = []
    for table, keys in values.owned().items():
        section = document.get(table)
        for key, want in keys.items():
            got = section.get(key) if isinstance(section, Mapping) else None
            if got != want:
                problems.append(f"[{table}] {key} is {got!r}, expected {want!r}")
    budget = document.get("memory", {}).get("total_budget")
    if not (isinstance(budget, str) and _GIB_FORM.match(budget)):
        problems.append(f"[memory] total_budget {budget!r} is not in '<n>GiB' form")
    return problems


def write_verified(path: Path, values: DaemonConfigValues, base: Mapping[str, Any] | None) -> None:
    """Write atomically, read the file back and check it: the daemon gets this file or nothing.

    Raises :class:`cuzk_supervisor.adapters.files.WriteError` when the run folder cannot take it
    (disk full, read-only, a file where the folder should be) and :class:`UsageError` when it
    reads back different from what was written.
    """
    document = render(values, base)
    try:
        files.atomic_write(path, tomli_w.dumps(document).encode("utf-8"), files.FILE_MODE)
        written = files.read_regular(path).decode("utf-8")
    except OSError as exc:
        raise files.WriteError("daemon config", path, exc) from None
    problems = check(tomllib.loads(written), values)
    if problems:
        raise UsageError(
            f"daemon config {path} did not read back as written: {'; '.join(problems)}"
        )
