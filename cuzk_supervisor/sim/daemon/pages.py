"""Real pages behind simulated memory, mapped and unmapped off the event loop.

Backing a piece with real memory means a page fault per page; done on the event loop it stalled
every call the daemon was serving (docs/simulator.md, "Model": 75-200 ms a proof on a loaded
machine, half a proof interval at a time scale of 200). The real daemon allocates in its worker
threads and answers from others.

:class:`Pages` maps each piece in one background thread with ``MAP_POPULATE`` (the kernel backs
every page inside the ``mmap`` call, which runs without the GIL) and unmaps it there too, in the
order asked, so a piece freed at once is still mapped first and then unmapped. The real memory
follows the simulated accounting (which never waits) within milliseconds on an idle machine, and
further behind on a loaded one; :attr:`Pages.pending` says how many changes are still queued
(``cuzk_sim_rss_pending_changes``), so whoever reads RSS can wait for it to catch up.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

PAGE = mmap.PAGESIZE
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere every page is written instead


def touched_mapping(size: int) -> mmap.mmap:
    """An anonymous mapping of ``size`` bytes with every page backed by real memory (a bare
    mapping stays virtual and would not show in RSS)."""
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
    if not _POPULATE:
        view = memoryview(buf)
        view[::PAGE] = b"\x01" * len(range(0, size, PAGE))  # one write per page
        view.release()
    return buf


@dataclass(eq=False, slots=True)
class Piece:
    """One piece's real memory; ``buf`` is set by the worker once it is mapped."""

    size: int
    buf: mmap.mmap | None = None


class Pages:
    """One worker thread mapping and unmapping pieces in the order asked (started on first use,
    a daemon thread: it never holds the process up at exit)."""

    def __init__(self, mapper: Callable[[int], mmap.mmap] = touched_mapping) -> None:
        self._mapper = mapper
        # A Queue, not a SimpleQueue: it counts what was put and not yet marked done.
        self._queue: queue.Queue[tuple[bool, Piece]] = queue.Queue()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Mappings and unmappings asked for and not yet done."""
        return self._queue.unfinished_tasks

    def map(self, size: int) -> Piece:
        piece = Piece(size)
        self._put(True, piece)
        return piece

    def unmap(self, piece: Piece) -> None:
        self._put(False, piece)

    def _put(self, mapping: bool, piece: Piece) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sim-pages", daemon=True)
            self._thread.start()
        self._queue.put((mapping, piece))

    def _run(self) -> None:
        while True:
            mapping, piece = self._queue.get()
            if mapping:
                piece.buf = self._mapper(piece.size)
            elif piece.buf is not None:
                piece.buf.close()
                piece.buf = None
            self._queue.task_done()
