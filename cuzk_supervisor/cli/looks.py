"""What ``doctor`` and the check before ``run`` both look at: the state file's name, folders that
may not exist yet, the state a previous run left, and what the param cache's disk must still take.

Looks only. Its own light module, so that ``run`` and ``prestart`` load neither the doctor
package (httpx) nor the parameter fetcher.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cuzk_supervisor.adapters.state import STATE_FILE as STATE_FILE
from cuzk_supervisor.core.disk import DiskNeed, disk_need

if TYPE_CHECKING:
    from cuzk_supervisor.adapters.params import ExpectedFile
    from cuzk_supervisor.adapters.state.doc import SupervisorState
    from cuzk_supervisor.settings import Settings

MAX_STATE_BYTES = 16 << 20


class DiskUsage(Protocol):
    """What ``shutil.disk_usage`` answers that the disk checks read."""

    @property
    def free(self) -> int: ...


def writable(folder: Path) -> bool:
    return os.access(
        folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids
    )


def nearest_existing(path: Path) -> Path:
    """``path`` if it exists, else its closest existing ancestor."""
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or "/")


def could_create_in(parent: Path) -> str | None:
    """Why a folder could not be made below ``parent`` (an existing path); None: it could."""
    if not parent.is_dir():
        return f"{parent}: {os.strerror(errno.ENOTDIR)}"
    if not writable(parent):
        return f"{parent}: not writable"
    return None


def previous_state(s: Settings) -> SupervisorState | None:
    """The state a previous run left; anything unusable is as good as none (the run itself
    moves a bad file aside and starts afresh)."""
    from cuzk_supervisor.adapters.state.doc import SupervisorState  # only when there is a file

    path = s.state_dir / STATE_FILE
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_STATE_BYTES:
            return None
        return SupervisorState.from_json(path.read_text(encoding="utf-8"))
    except Exception:  # unreadable, or malformed (StateFormatError and what validation raises)
        return None


def present_param_bytes(cache: Path, expected: Sequence[ExpectedFile]) -> int:
    """Bytes of the ``expected`` parameter files already in ``cache`` at full size."""
    if not expected or not cache.is_dir():
        return 0
    # Not at the top: the parameter fetcher's module (asyncio, the output pump) is for the run.
    from cuzk_supervisor.adapters.params import file_sizes

    sizes = file_sizes(cache, expected)
    return sum(f.size for f in expected if sizes.get(f.name) == f.size)


def param_cache_need(s: Settings, previous: SupervisorState | None) -> DiskNeed:
    """What the param cache's file system must still take (``core.disk.disk_need``), less what
    a previous run wrote, in the simulator's sizes when ``plan_memory_scale`` is not 1."""
    from cuzk_supervisor.adapters.params import parse_expected  # as in present_param_bytes

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
