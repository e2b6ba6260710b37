"""The params phase: make sure the proof parameters are on disk, with progress a person can see.

Runs the operator's fetch command (if any) as a supervised child, measures progress from bytes
on disk (not from the command's output, whose format we do not own), and verifies the expected
files and sizes afterwards. Already present with the right sizes: nothing is fetched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from cuzk_supervisor.adapters import files
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
) -> ParamsOutcome:
    """Skip when everything expected is present; else fetch with progress, then verify.

    A fetch a killed supervisor left running into the same folder is stopped first (found by
    ``pidfile``, where the fetch's pid is recorded while it runs, and by its environment:
    :mod:`cuzk_supervisor.daemon.leftovers`), so there is only ever one fetch writing the files.
    Raises :class:`ParamsFailed` (also when the folder cannot be made).
    """
    try:
        files.make_folder(folder)  # a quick metadata call: fine in the loop
    except OSError as exc:
        why = files.describe(exc)
        raise ParamsFailed(f"cannot make the params folder {folder}: {why}") from None
    role = fetch_role(folder)
    await asyncio.to_thread(leftovers.reclaim, role, pidfile, stop_grace_s)
    if expected and not missing(expected, file_sizes(folder, expected)):
        log.info("params.present", folder=str(folder), files=len(expected))
        return ParamsOutcome(fetched=False, progress=None)
    if not fetch_command:
        if expected:
            gaps = missing(expected, file_sizes(folder, expected))
            raise ParamsFailed(f"parameters missing and no fetch command set: {', '.join(gaps)}")
        log.info("params.no_fetch", detail="no fetch command and no expected files")
        return ParamsOutcome(fetched=False, progress=None)
    total = sum(f.size for f in expected) or None
    log.info("params.fetch_started", command=fetch_command, folder=str(folder), total_bytes=total)
    proc = await spawn(
        "/bin/sh", "-c", fetch_command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(folder),
        env=child_environ(leftovers.env_marks(role)),
        umask=files.CHILD_UMASK,  # the params it writes: never world-writable
        start_new_session=True,
    )  # fmt: skip
    if pidfile is not None:
        await asyncio.to_thread(leftovers.record, pidfile, proc.pid)
    pump = pump or OutputPump("setup", None)
    assert proc.stdout is not None
    reader = asyncio.create_task(pump.pump(proc.stdout, "stdout"))
    started = time.monotonic()
    samples: list[tuple[float, int]] = [(started, bytes_on_disk(folder, expected))]
    last: Progress | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    await within(asyncio.shield(proc.wait()), progress_interval_s)
                    break
                except TimeoutError:
                    samples = [*samples[-5:], (time.monotonic(), bytes_on_disk(folder, expected))]
                    last = progress(samples, total, started)
                    log.info("params.progress", **last.fields())
                    if on_progress is not None:
                        on_progress(last)
    except TimeoutError:
        await _stop_group(proc, stop_grace_s)
        raise ParamsFailed(f"fetch command still running after {timeout_s:g} s: stopped") from None
    finally:
        if proc.returncode is None:  # cancelled (a signal): do not leave the download running
            await asyncio.shield(_stop_group(proc, stop_grace_s))
        await asyncio.wait({reader}, timeout=1.0)
        reader.cancel()
        if pidfile is not None:
            leftovers.forget(pidfile)
    if proc.returncode != 0:
        tail = pump.tail[-1] if pump.tail else "no output"
        raise ParamsFailed(f"fetch command exited with code {proc.returncode} (last line: {tail})")
    gaps = missing(expected, file_sizes(folder, expected))
    if gaps:
        raise ParamsFailed(f"fetch finished but files are wrong: {', '.join(gaps)}")
    final = progress(
        [*samples, (time.monotonic(), bytes_on_disk(folder, expected))], total, started
    )
    log.info("params.fetched", **final.fields())
    return ParamsOutcome(fetched=True, progress=final)


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
