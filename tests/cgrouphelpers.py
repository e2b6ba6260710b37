"""Real memory cgroups for tests: a child of this process's own memory cgroup with a limit, a
command run inside it, its ``oom_kill`` counter, and its removal.

The development machines and CI run as root with writable cgroups (v1 on the current ones), so
a test can let the kernel's OOM killer act for real (docs/development.md, "Development")::

    from cgrouphelpers import MemoryCgroup, cgroups_writable

    ok, why = cgroups_writable()
    if not ok:
        pytest.skip(why)
    with MemoryCgroup.create("oom-test", limit_bytes=600 << 20) as cg:
        proc = subprocess.Popen([*cg.prefix(), sys.executable, "-c", "..."])
        ...
        assert cg.oom_kills() == 1

``prefix()`` is a tiny ``sh`` wrapper that writes its own pid into the cgroup and then ``exec``s
the command, so the command (and every child it starts) is inside before its first instruction.

The discovery below is deliberately independent of
``cuzk_supervisor.adapters.machine.resources``: a test that found
the cgroup with the product's own code could not catch that code finding the wrong one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cuzk_supervisor.adapters.machine.cgroupfind import discover_memory_cgroup

MIB = 1 << 20
_V1 = 1
_V2 = 2


# --------------------------------------------------------------------------------------------
# Where this process's memory cgroup is


@dataclass(frozen=True)
class Hierarchy:
    """The memory hierarchy this process is in: its version, mount point and our cgroup."""

    version: int
    mount: Path
    own: Path


def find_hierarchy(pid: int | str = "self") -> Hierarchy | None:
    """This process's memory cgroup, found the way the supervisor finds it (a v1 hierarchy with
    the memory controller if there is one, else the unified one). None when none is mounted."""
    location = discover_memory_cgroup(pid=pid)  # type: ignore[arg-type]
    if location is None:
        return None
    return Hierarchy(location.version, location.mount, location.dir)


# --------------------------------------------------------------------------------------------
# One child cgroup


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read_keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


class MemoryCgroup:
    """A child memory cgroup with a hard limit (and no swap to hide behind)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    # --- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str = "", limit_bytes: int | None = None) -> MemoryCgroup:
        """A new child of this process's memory cgroup (v2: of the first ancestor that can
        have one with the memory controller on). OSError when that is not allowed here."""
        hierarchy = find_hierarchy()
        if hierarchy is None:
            raise OSError(errno.ENOENT, "no memory cgroup hierarchy is mounted")
        leaf = f"{name or 'test'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        parent = hierarchy.own if hierarchy.version == _V1 else _v2_parent(hierarchy)
        path = parent / leaf
        path.mkdir()
        cgroup = cls(path, hierarchy.version)
        try:
            if limit_bytes is not None:
                cgroup.set_limit(limit_bytes)
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    def set_limit(self, limit_bytes: int) -> None:
        """The memory limit, and the same limit on memory + swap (v1) or no swap at all (v2):
        with swap the kernel would page the test's allocations out instead of OOM-killing."""
        if self.version == _V1:
            memsw = self.path / "memory.memsw.limit_in_bytes"
            # memsw may never be below the memory limit: order the writes so neither is.
            current = _read_int(self.path / "memory.limit_in_bytes")
            if memsw.exists() and current is not None and limit_bytes > current:
                _write(memsw, str(limit_bytes))
                _write(self.path / "memory.limit_in_bytes", str(limit_bytes))
            else:
                _write(self.path / "memory.limit_in_bytes", str(limit_bytes))
                if memsw.exists():
                    _write(memsw, str(limit_bytes))
            with contextlib.suppress(OSError):
                _write(self.path / "memory.swappiness", "0")
        else:
            _write(self.path / "memory.max", str(limit_bytes))
            with contextlib.suppress(OSError):
                _write(self.path / "memory.swap.max", "0")

    # --- running something inside ---------------------------------------------------------
    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def prefix(self) -> list[str]:
        """Put before a command: ``sh`` joins the cgroup, then ``exec``s the command, so the
        command and all its children run inside from their first instruction."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs_file)]

    def pids(self) -> list[int]:
        try:
            text = self.procs_file.read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    # --- readings -------------------------------------------------------------------------
    def oom_kills(self) -> int:
        """The kernel's OOM kills in this cgroup (v1 ``memory.oom_control``, v2
        ``memory.events``)."""
        name = "memory.oom_control" if self.version == _V1 else "memory.events"
        return _read_keyed(self.path / name).get("oom_kill", 0)

    def usage(self) -> int:
        name = "memory.usage_in_bytes" if self.version == _V1 else "memory.current"
        return _read_int(self.path / name) or 0

    def peak(self) -> int | None:
        """Highest usage seen (v1 ``max_usage_in_bytes``, v2 ``memory.peak`` where the kernel
        has it)."""
        name = "memory.max_usage_in_bytes" if self.version == _V1 else "memory.peak"
        return _read_int(self.path / name)

    def limit(self) -> int | None:
        name = "memory.limit_in_bytes" if self.version == _V1 else "memory.max"
        return _read_int(self.path / name)

    # --- removal --------------------------------------------------------------------------
    def kill_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout: float = 10.0) -> None:
        """Kill what is left inside, then rmdir (retried: a killed task leaves the cgroup a
        moment after it dies). Raises OSError if it is still busy after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self.kill_all()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _v2_parent(hierarchy: Hierarchy) -> Path:
    """v2 forbids processes in a cgroup whose children have controllers ("no internal
    processes"), except at the root: use our own cgroup when it can delegate memory, else the
    mount root."""
    for candidate in (hierarchy.own, hierarchy.mount):
        control = candidate / "cgroup.subtree_control"
        try:
            if "memory" not in control.read_text().split():
                _write(control, "+memory")
            return candidate
        except OSError:
            continue
    raise OSError(errno.EBUSY, "no v2 cgroup here can delegate the memory controller")


# --------------------------------------------------------------------------------------------
# The probe tests skip on


_PROBE: tuple[bool, str] | None = None


def cgroups_writable() -> tuple[bool, str]:
    """(True, "") when a child memory cgroup with a limit can be made, joined and removed
    here; else (False, the precise reason). Cached for the session."""
    global _PROBE
    if _PROBE is None:
        _PROBE = _probe()
    return _PROBE


def _probe() -> tuple[bool, str]:
    hierarchy = find_hierarchy()
    if hierarchy is None:
        return False, "no memory cgroup hierarchy (v1 or v2) is mounted"
    try:
        cgroup = MemoryCgroup.create("probe", limit_bytes=64 * MIB)
    except OSError as exc:
        return False, (
            f"cannot create a limited memory cgroup under {hierarchy.own} "
            f"(cgroup v{hierarchy.version}): {exc.strerror or exc}"
        )
    verdict = _try_cgroup(cgroup)
    try:
        cgroup.remove()
    except OSError as exc:
        return False, f"cannot remove the probe cgroup {cgroup.path}: {exc.strerror or exc}"
    return verdict


def _try_cgroup(cgroup: MemoryCgroup) -> tuple[bool, str]:
    if cgroup.limit() != 64 * MIB:
        return False, f"the memory limit did not stick in {cgroup.path} (read {cgroup.limit()})"
    joined = subprocess.run(
        [*cgroup.prefix(), "cat", "/proc/self/cgroup"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if joined.returncode != 0:
        return False, f"cannot move a process into {cgroup.path}: {joined.stderr.strip()}"
    if cgroup.path.name not in joined.stdout:
        return False, f"a process that wrote itself to {cgroup.procs_file} is not in it"
    return True, ""
