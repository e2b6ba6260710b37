"""Real, scaled memory: what the simulated daemon holds, allocated for real so RSS shows it.

Each piece is an anonymous mmap with every page backed (a bare ``bytearray`` or mmap stays
virtual), and is unmapped when freed, so RSS falls again (freed heap memory might not be
returned). The simulated total is tracked exactly, apart from Python's own overhead. A piece
allocated with ``background=True`` (the partitions, which churn while proofs are served) is
mapped and unmapped by a worker thread (``sim.daemon.pages``), so the event loop never waits on its
page faults; its real memory follows within milliseconds.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Hashable

from cuzk_supervisor.sim.daemon.model import GIB
from cuzk_supervisor.sim.daemon.pages import Pages, Piece, touched_mapping

MIB = 1 << 20


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
        self._held: dict[Hashable, tuple[float, mmap.mmap | Piece | None]] = {}
        self._pages = Pages()

    @property
    def simulated_bytes(self) -> int:
        return int(sum(gib for gib, _ in self._held.values()) * GIB)

    @property
    def simulated_gib(self) -> float:
        return sum(gib for gib, _ in self._held.values())

    @property
    def pending_changes(self) -> int:
        """Background pieces whose real mapping or unmapping is still queued: RSS lags the
        simulated total until this is 0."""
        return self._pages.pending

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    def alloc(self, key: Hashable, gib: float, *, background: bool = False) -> None:
        """Hold ``gib`` simulated GiB under ``key`` (replacing what ``key`` held); with
        ``background`` its real pages are mapped by the worker thread."""
        self.free(key)
        real = int(gib * self.scale * MIB)
        buf: mmap.mmap | Piece | None = None
        if real > 0:
            buf = self._pages.map(real) if background else touched_mapping(real)
        self._held[key] = (gib, buf)
        self._changed()
        if self._on_grow is not None:
            self._on_grow(key, self.simulated_gib)

    def free(self, key: Hashable) -> float:
        """Release ``key``; returns the simulated GiB freed (0 if it held nothing)."""
        gib, buf = self._held.pop(key, (0.0, None))
        if buf is not None:
            if isinstance(buf, Piece):
                self._pages.unmap(buf)
            else:
                buf.close()
            self._changed()
        return gib

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(int(self.simulated_gib * self.scale * MIB))
