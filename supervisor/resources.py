"""Samplers that turn the machine into plain snapshot data (psutil, cgroup v1/v2, PSI, NVML).

Only the cgroup OOM counter lives here so far; the full sampler comes with the resource watcher.
"""

from __future__ import annotations

from pathlib import Path


def _counter(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def read_oom_kill_count(cgroup_dir: Path) -> int | None:
    """The memory cgroup's ``oom_kill`` counter: v2 ``memory.events``, else v1
    ``memory.oom_control``; None when neither file has it (no cgroup, or an old kernel)."""
    for name in ("memory.events", "memory.oom_control"):
        count = _counter(cgroup_dir / name, "oom_kill")
        if count is not None:
            return count
    return None
