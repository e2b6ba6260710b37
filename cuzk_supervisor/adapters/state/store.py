"""The durable state file: one versioned JSON document that survives a container restart.

Rules (docs/architecture.md, rule 4, "durable before visible"):

- A save is atomic and durable: the document goes to a temp file in the same folder, the file is
  flushed and fsynced, ``os.replace`` puts it in place, then the folder is fsynced so the rename
  itself survives a power cut. A crash at any point leaves either the old file or the new one.
- A load never crashes the supervisor. A missing file is a fresh start; a file that cannot be
  read, is not JSON, has an unknown version or the wrong shape is moved aside
  (``<name>.corrupt-<timestamp>``, for a person to look at) with one warning, and a fresh state
  is returned. Fresh is safe: params are verified again, the benchmark runs again, and
  registering again is idempotent per label at the manager.
- A failed write raises :class:`StateWriteError` (one line: the path and the OS error).

This module is the file: :class:`StateStore` loads and saves it, :class:`StateKeeper` owns the
current state in the event loop and serialises writers. The document is ``state.doc``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from cuzk_supervisor.adapters import files
from cuzk_supervisor.adapters.files import FileOps
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState, utc_now_iso
from cuzk_supervisor.adapters.state.fields import StateFormatError
from cuzk_supervisor.errors import UsageError

log = structlog.get_logger("supervisor.state")

MAX_STATE_BYTES = 16 * 1024 * 1024
"""A state file larger than this is not ours (a few kB in practice): moved aside unread."""


class StateFolderUnsafe(UsageError):
    """The state folder is world-writable and its mode cannot be fixed: refuse to start (exit 2).
    Anyone could plant a state file (a uuid, reports) or replace ours."""


class StateWriteError(Exception):
    """The state file could not be written; the message is one line naming the path and why."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.error = error
        why = f"[Errno {error.errno}] {error.strerror}" if error.errno else str(error)
        super().__init__(f"cannot write state file {path}: {why}")


@dataclass(frozen=True, slots=True)
class Loaded:
    """What :meth:`StateStore.load_detailed` found."""

    state: SupervisorState
    status: str
    """``loaded``, ``missing`` (fresh start) or ``recovered`` (a bad file was moved aside)."""
    problem: str | None = None
    moved_to: Path | None = None


class StateStore:
    """Load and save the state file at ``path``. ``save`` is synchronous and thread-safe (one
    writer at a time); in the event loop use :class:`StateKeeper`, which runs it in a thread."""

    def __init__(
        self,
        path: Path | str,
        *,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.ops = ops if ops is not None else FileOps()
        self.clock = clock
        self._lock = threading.Lock()

    def load(self) -> SupervisorState:
        return self.load_detailed().state

    def load_detailed(self) -> Loaded:
        """Read the state file; raise :class:`StateFolderUnsafe` when its folder is
        world-writable and cannot be fixed. Never blocks: a FIFO or device is moved aside."""
        self._check_folder()
        try:
            text = files.read_regular(self.path, MAX_STATE_BYTES).decode("utf-8")
        except FileNotFoundError:
            return Loaded(SupervisorState(), "missing")
        except (OSError, UnicodeDecodeError) as exc:
            return self._recover(f"unreadable: {exc}")
        try:
            state = SupervisorState.from_json(text)
        except StateFormatError as exc:
            return self._recover(str(exc))
        return Loaded(state, "loaded")

    def _check_folder(self) -> None:
        folder = self.path.parent
        try:
            if not files.world_writable(folder):
                return
        except OSError:
            return  # missing (the first save makes it, 0750) or unusable (the save says why)
        try:
            fixed = files.ensure_private_folder(folder)
        except OSError as exc:
            raise StateFolderUnsafe(
                f"state folder {folder} is world-writable and its mode cannot be fixed "
                f"({files.describe(exc)}): make it 0750 and owned by this user"
            ) from None
        if fixed:
            log.warning(
                "state.folder_mode_fixed",
                folder=str(folder),
                detail="the state folder was world-writable: the write bit for others is removed",
            )

    def _recover(self, problem: str) -> Loaded:
        stamp = datetime.fromtimestamp(self.clock(), tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        moved_to: Path | None = target
        move_error = None
        try:
            os.replace(self.path, target)
        except OSError as exc:
            # Never crash on load; the next save will say clearly if the folder is unwritable.
            moved_to, move_error = None, str(exc)
        log.warning("state.corrupt", path=str(self.path), problem=problem,
                    moved_to=str(moved_to) if moved_to else None, move_error=move_error,
                    action="starting from a fresh state")  # fmt: skip
        return Loaded(SupervisorState(), "recovered", problem, moved_to)

    def save(self, state: SupervisorState) -> SupervisorState:
        """Write ``state`` atomically and durably (:func:`files.atomic_write`); return it with
        ``updated_at`` stamped. Raises :class:`StateWriteError`; the old file is then untouched."""
        stamped = dataclasses.replace(state, updated_at=utc_now_iso(self.clock))
        data = stamped.to_json().encode("utf-8")
        with self._lock:
            try:
                files.atomic_write(self.path, data, files.PRIVATE_MODE, self.ops)
            except OSError as exc:
                raise StateWriteError(self.path, exc) from exc
        return stamped


class StateKeeper:
    """Owns the current state in the event loop: one writer at a time, in call order.

    ``update`` applies a change to the latest state, saves it (in a thread: fsync can take
    milliseconds) and only then makes it current (durable before visible). asyncio.Lock is FIFO,
    so concurrent writers never lose each other's changes if each touches only its own fields.
    """

    def __init__(self, store: StateStore, state: SupervisorState | None = None) -> None:
        self.store = store
        self._state = state if state is not None else store.load()
        self._lock = asyncio.Lock()

    @property
    def state(self) -> SupervisorState:
        return self._state

    async def update(self, change: Callable[[SupervisorState], SupervisorState]) -> SupervisorState:
        """Apply ``change`` and save; raise :class:`StateWriteError` (state left unchanged)."""
        async with self._lock:
            new = change(self._state)
            self._state = await asyncio.to_thread(self.store.save, new)
            return self._state

    async def save_outbox(self, pending: Iterable[Report], acked: Iterable[Report]) -> None:
        """The outbox's save callback (:data:`.outbox.SaveOutbox` of the manager adapter)."""
        pending_t, acked_t = tuple(pending), tuple(acked)
        await self.update(lambda s: dataclasses.replace(s, outbox=pending_t, acked=acked_t))
