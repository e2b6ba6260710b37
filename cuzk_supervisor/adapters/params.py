"""The params phase: make sure the proof parameters are on disk, with progress a person can see.

Runs the operator's fetch command (if any) as a supervised child, measures progress from bytes
on disk (not from the command's output, whose format we do not own), and verifies the expected
files and sizes afterwards. Already present with the right sizes: nothing is fetched. One writer
at a time, by construction: all of it happens under the params lock, which the fetch and all it
starts hold (:mod:`cuzk_supervisor.adapters.paramslock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from cuzk_supervisor.adapters import files, paramslock
from cuzk_supervisor.daemon import leftovers
from cuzk_supervisor.daemon.childenv import child_environ
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.deadline import within

log = structlog.get_logger()

Spawner = Callable[..., Awaitable[asyncio.subprocess.Process]]


@dataclass(frozen=True, slots=True)
class ExpectedFile:
    name: str
    size: int


def parse_expected(entries: Sequence[str]) -> list[ExpectedFile]:
    """``NAME:BYTES`` entries (validated by settings) → expected files."""
    files = []
    for entry in entries:
        name, _, size = entry.rpartition(":")
        files.append(ExpectedFile(name, int(size)))
    return files


# --- pure -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    done_bytes: int
    total_bytes: int | None
    elapsed_s: float
    rate_bytes_s: float

    @property
    def percent(self) -> float | None:
        if not self.total_bytes:
            return None
        return min(100.0, 100.0 * self.done_bytes / self.total_bytes)

    @property
    def eta_s(self) -> float | None:
        if not self.total_bytes or self.rate_bytes_s <= 0:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / self.rate_bytes_s)

    def fields(self) -> dict[str, object]:
        """The ``params.progress`` event's fields (the terminal view words them)."""
        return {
            "done_bytes": self.done_bytes,
            "total_bytes": self.total_bytes,
            "percent": None if self.percent is None else round(self.percent, 1),
            "rate_bytes_s": round(self.rate_bytes_s),
            "eta_s": None if self.eta_s is None else round(self.eta_s),
            "elapsed_s": round(self.elapsed_s, 1),
        }


def progress(
    samples: Sequence[tuple[float, int]], total_bytes: int | None, started_at: float
) -> Progress:
    """Progress from (time, bytes on disk) samples; the rate over the recent samples."""
    now, done = samples[-1]
    first_t, first_b = samples[0]
    span = now - first_t
    rate = (done - first_b) / span if span > 0 else 0.0
    return Progress(done, total_bytes, now - started_at, max(0.0, rate))


def missing(expected: Sequence[ExpectedFile], sizes: dict[str, int | None]) -> list[str]:
    """Expected files absent or of the wrong size (``name (have N, want M)``)."""
    problems = []
    for file in expected:
        have = sizes.get(file.name)
        if have != file.size:
            problems.append(
                f"{file.name} (have {have if have is not None else 'none'}, want {file.size})"
            )
    return problems


# --- I/O ------------------------------------------------------------------------------------


def file_sizes(folder: Path, expected: Sequence[ExpectedFile]) -> dict[str, int | None]:
    sizes: dict[str, int | None] = {}
    for file in expected:
        try:
            sizes[file.name] = (folder / file.name).stat().st_size
        except OSError:
            sizes[file.name] = None
    return sizes


def bytes_on_disk(folder: Path, expected: Sequence[ExpectedFile]) -> int:
    """Bytes so far: of the expected files if listed, else of everything under the folder."""
    if expected:
        return sum(size or 0 for size in file_sizes(folder, expected).values())
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


def fetch_role(folder: Path) -> str:
    """The fetch's mark (:mod:`cuzk_supervisor.daemon.leftovers`): one fetch per params folder."""
    return f"fetch:{os.path.abspath(folder)}"


class ParamsFailed(Exception):
    """The parameters could not be made ready; the message is the reason for the manager."""


@dataclass(frozen=True, slots=True)
class ParamsOutcome:
    fetched: bool
    progress: Progress | None


async def ensure_params(
    folder: Path,
    expected: Sequence[ExpectedFile],
    fetch_command: str,
    *,
    timeout_s: float,
    progress_interval_s: float,
    spawn: Spawner = asyncio.create_subprocess_exec,
    on_progress: Callable[[Progress], None] | None = None,
    pump: OutputPump | None = None,
    stop_grace_s: float = 5.0,
    pidfile: Path | None = None,
    lock_wait_s: float = 60.0,
) -> ParamsOutcome:
    """Skip when everything expected is present; else fetch with progress, then verify; all of
    it under the params lock, waited for ``lock_wait_s`` (see the module docstring). What a
    killed supervisor left running with its marks (``pidfile``, the environment:
    :mod:`cuzk_supervisor.daemon.leftovers`) is stopped first. Raises :class:`ParamsFailed`
    (also when the folder cannot be made, or the lock is still held after the wait).
    """
    try:
        files.make_folder(folder)  # a quick metadata call: fine in the loop
    except OSError as exc:
        why = files.describe(exc)
        raise ParamsFailed(f"cannot make the params folder {folder}: {why}") from None
    role = fetch_role(folder)
    locked = functools.partial(paramslock.held, folder, role=role, pidfile=pidfile,
                               wait_s=lock_wait_s, grace_s=stop_grace_s)  # fmt: skip
    try:
        async with locked() as lock_fd:
            await asyncio.to_thread(leftovers.reclaim, role, pidfile, stop_grace_s)
            if expected and not missing(expected, file_sizes(folder, expected)):
                log.info("params.present", folder=str(folder), files=len(expected))
                return ParamsOutcome(fetched=False, progress=None)
            if not fetch_command:
                if expected:
                    gaps = missing(expected, file_sizes(folder, expected))
                    raise ParamsFailed(
                        f"parameters missing and no fetch command set: {', '.join(gaps)}"
                    )
                log.info("params.no_fetch", detail="no fetch command and no expected files")
                return ParamsOutcome(fetched=False, progress=None)
            fetch = _Fetch(folder, expected, fetch_command, spawn, pump, stop_grace_s, pidfile)
            samples = await fetch.run(lock_fd, role, timeout_s, progress_interval_s, on_progress)
        # Taken again on a description of our own: nothing the fetch started still writes.
        async with locked():
            gaps = missing(expected, file_sizes(folder, expected))
            done = bytes_on_disk(folder, expected)
    except paramslock.LockUnavailable as exc:
        raise ParamsFailed(str(exc)) from None
    if gaps:
        raise ParamsFailed(f"fetch finished but files are wrong: {', '.join(gaps)}")
    final = progress([*samples, (time.monotonic(), done)], fetch.total, fetch.started)
    log.info("params.fetched", **final.fields())
    return ParamsOutcome(fetched=True, progress=final)


class _Fetch:
    """The fetch command as a child: started in a session of its own with the lock's
    descriptor, its progress sampled from the bytes on disk, stopped (its group) on a timeout
    or a cancel."""

    def __init__(
        self,
        folder: Path,
        expected: Sequence[ExpectedFile],
        command: str,
        spawn: Spawner,
        pump: OutputPump | None,
        stop_grace_s: float,
        pidfile: Path | None,
    ) -> None:
        self.folder, self.expected, self.command = folder, expected, command
        self.spawn, self.stop_grace_s, self.pidfile = spawn, stop_grace_s, pidfile
        self.pump = pump or OutputPump("setup", None)
        self.total = sum(f.size for f in expected) or None
        self.started = time.monotonic()

    async def run(
        self,
        lock_fd: int,
        role: str,
        timeout_s: float,
        progress_interval_s: float,
        on_progress: Callable[[Progress], None] | None,
    ) -> list[tuple[float, int]]:
        """Until the command exits 0: the progress samples; else :class:`ParamsFailed`."""
        folder, expected = self.folder, self.expected
        log.info("params.fetch_started", command=self.command, folder=str(folder),
                 total_bytes=self.total)  # fmt: skip
        proc = await self.spawn(
            "/bin/sh", "-c", self.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(folder),
            env=child_environ(leftovers.env_marks(role)),
            umask=files.CHILD_UMASK,  # the params it writes: never world-writable
            start_new_session=True,
            pass_fds=(lock_fd,),  # the lock, held by the fetch and all it starts
        )  # fmt: skip
        if self.pidfile is not None:
            await asyncio.to_thread(leftovers.record, self.pidfile, proc.pid)
        assert proc.stdout is not None
        reader = asyncio.create_task(self.pump.pump(proc.stdout, "stdout"))
        self.started = time.monotonic()
        samples: list[tuple[float, int]] = [(self.started, bytes_on_disk(folder, expected))]
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        await within(asyncio.shield(proc.wait()), progress_interval_s)
                        break
                    except TimeoutError:
                        now = (time.monotonic(), bytes_on_disk(folder, expected))
                        samples = [*samples[-5:], now]
                        last = progress(samples, self.total, self.started)
                        log.info("params.progress", **last.fields())
                        if on_progress is not None:
                            on_progress(last)
        except TimeoutError:
            await _stop_group(proc, self.stop_grace_s)
            raise ParamsFailed(
                f"fetch command still running after {timeout_s:g} s: stopped"
            ) from None
        finally:
            if proc.returncode is None:  # cancelled (a signal): do not leave the download running
                await asyncio.shield(_stop_group(proc, self.stop_grace_s))
            await asyncio.wait({reader}, timeout=1.0)
            reader.cancel()
            if self.pidfile is not None:
                leftovers.forget(self.pidfile)
        if proc.returncode != 0:
            tail = self.pump.tail[-1] if self.pump.tail else "no output"
            raise ParamsFailed(
                f"fetch command exited with code {proc.returncode} (last line: {tail})"
            )
        return samples


async def _stop_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the fetch command's group (curl, aria2c … it started), SIGKILL after grace."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        try:
            await within(asyncio.shield(proc.wait()), grace_s)
            return
        except TimeoutError:
            continue
    await proc.wait()
