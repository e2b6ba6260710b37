"""What the phase machine and its collaborators share: the progress, the signals, the failures.

One ``Progress`` and one ``Signals`` are made by the composition root and handed to every
collaborator: the phase machine writes the phase, the proof runner the counts, the daemon control
the last failure; the status line and ``/readyz`` read them. The signals are the events they raise
to each other (memory trouble, a daemon exit, the manager's kill, an outbox kick).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from cuzk_supervisor.core.bench import Stretch
from cuzk_supervisor.core.bound import StatusSample


class LifecycleFailure(Exception):
    """The lifecycle cannot go on: ``reason`` goes to the manager, ``exit_code`` to the shell."""

    def __init__(self, exit_code: int, reason: str) -> None:
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


class _Interruption(Exception):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class MemoryTrouble(_Interruption):
    """Critical memory or an OOM kill interrupted a proof: step down and try again."""


class DaemonRestarted(_Interruption):
    """The daemon exited under a proof (crash, liveness kill) and its keeper is restarting it:
    the jobs in flight are lost with it."""


@dataclass
class Progress:
    """What the status lines say: kept by the lifecycle, read by the status task."""

    phase: str = "start"
    phase_started: float = dataclasses.field(default_factory=time.monotonic)
    proofs_done: int = 0
    proofs_failed: int = 0
    step_downs: int = 0
    last_failure: str = ""
    """The latest failure in words (a daemon exit, a failed proof): ``/readyz`` shows it."""
    stretch: Stretch | None = None  # the bench stretch being run (its completions so far)
    bench_planned: int = 0
    bench_samples: tuple[StatusSample, ...] = ()
    """The daemon's status sampled over the latest bench stretch (``bench_status_sample_s``)."""
    bench_window: tuple[float, float] | None = None
    """That stretch's first and last completion (monotonic): the samples the verdict reads."""
    register_failures: int = 0  # failed ``/register`` attempts so far (the manager is away)
    register_retry_at: float | None = None
    """When (monotonic) the next ``/register`` attempt is due; None: not waiting."""


class Signals:
    """The events raised between the collaborators; each with the reason it was raised for."""

    def __init__(self) -> None:
        self.trouble = asyncio.Event()
        """Memory trouble (critical memory, an OOM kill): step down."""
        self.trouble_cause = ""
        self.trouble_daemon_running = False
        """The trouble is a critical level with the daemon still running (not an OOM kill):
        the proofs it was running are still there to estimate its active partitions from."""
        self.acted = asyncio.Event()  # a step-down was carried out: watch for the next one
        self.gone = asyncio.Event()  # the manager killed this instance
        self.gone_reason = ""
        self.daemon_exited = asyncio.Event()  # at every exit; cleared by proof work first
        self.exit_cause = ""
        self.outbox_kick = asyncio.Event()  # something was queued in the outbox: send it

    def flag_trouble(self, cause: str, *, daemon_running: bool) -> None:
        if not self.trouble.is_set():
            self.trouble_cause = cause
            self.trouble_daemon_running = daemon_running
            self.trouble.set()

    def mark_gone(self, reason: str) -> None:
        if not self.gone.is_set():
            self.gone_reason = reason
            self.gone.set()

    def daemon_exit(self, cause: str) -> None:
        self.exit_cause = cause
        self.daemon_exited.set()


def innermost_frame(exc: BaseException) -> str:
    """Where an unexpected exception was raised (``file.py:line``), for its one-line reason."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "no traceback"
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, its outcome retrieved (a failure it ends
    with is not asyncio's "Task exception was never retrieved" at exit). Our own cancellation
    while waiting goes on up."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
