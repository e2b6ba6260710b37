"""Real, scaled memory: what the simulated daemon holds, allocated for real so RSS shows it.

Each piece is an anonymous mmap with every page written (a bare ``bytearray`` or mmap stays
virtual), and is unmapped when freed, so RSS falls again (freed heap memory might not be
returned). The simulated total is tracked exactly, apart from Python's own overhead.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Hashable

from cuzk_supervisor.sim.model import GIB

MIB = 1 << 20
PAGE = mmap.PAGESIZE


def _touched_mapping(size: int) -> mmap.mmap:
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(buf)
    # One write per page makes the kernel back every page with real memory.
    view[::PAGE] = b"\x01" * len(range(0, size, PAGE))
    view.release()
    return buf


class Memory:
    """Named allocations in simulated GiB; ``scale`` real MiB are allocated per simulated GiB."""

    def __init__(
        self,
        scale_mib_per_gib: float,
        on_grow: Callable[[object, float], None] | None = None,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.scale = scale_mib_per_gib
        self._on_grow = on_grow
        self._on_change = on_change  # called with the real bytes held after every change
        self._held: dict[Hashable, tuple[float, mmap.mmap | None]] = {}

    @property
    def simulated_bytes(self) -> int:
        return int(sum(gib for gib, _ in self._held.values()) * GIB)

    @property
    def simulated_gib(self) -> float:
        return sum(gib for gib, _ in self._held.values())

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    def alloc(self, key: Hashable, gib: float) -> None:
        """Hold ``gib`` simulated GiB under ``key`` (replacing what ``key`` held)."""
        self.free(key)
        real = int(gib * self.scale * MIB)
        self._held[key] = (gib, _touched_mapping(real) if real > 0 else None)
        self._changed()
        if self._on_grow is not None:
            self._on_grow(key, self.simulated_gib)

    def free(self, key: Hashable) -> float:
        """Release ``key``; returns the simulated GiB freed (0 if it held nothing)."""
        gib, buf = self._held.pop(key, (0.0, None))
        if buf is not None:
            buf.close()
            self._changed()
        return gib

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(int(self.simulated_gib * self.scale * MIB))
