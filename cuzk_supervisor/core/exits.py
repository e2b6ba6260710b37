"""What a daemon exit *was*, as a value (docs/architecture.md, rule 5: failures are values).

Pure: the facts are gathered by ``daemon.py`` (return code, whether it was ever ready, whether we
asked it to stop, the cgroup's ``oom_kill`` counter before and after, the memory watcher's hint);
this module only decides what they mean.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import partial
from signal import Signals  # the enum of names only: nothing here sends or handles one


class ExitKind(enum.StrEnum):
    CLEAN = "clean"
    CRASHED = "crashed"
    KILLED = "killed"
    OOM_KILLED = "oom_killed"
    FAILED_TO_START = "failed_to_start"


@dataclass(frozen=True, slots=True)
class ExitFacts:
    """Everything observed about one daemon run, gathered by the process owner."""

    returncode: int | None  # None: the process never started
    was_ready: bool
    stop_requested: bool = False
    start_error: str = ""  # set when spawning failed or readiness never came
    oom_kills_before: int | None = None
    oom_kills_after: int | None = None
    memory_at_limit: bool = False  # the resource watcher saw usage at the limit just before
    last_lines: tuple[str, ...] = ()
    uptime_s: float = 0.0
    peak_rss_bytes: int = 0
    unresponsive: str = ""  # we killed it after missed liveness probes: why


@dataclass(frozen=True, slots=True)
class DaemonExit:
    kind: ExitKind
    reason: str
    code: int | None = None
    signal: int | None = None
    cgroup_oom_kills: int = 0
    uptime_s: float = 0.0
    peak_rss_bytes: int = 0
    # A start failure that retrying cannot fix (binary missing, address in use, never ready
    # within the whole startup budget): the supervisor stops instead of crash-looping.
    permanent: bool = False

    def as_fields(self) -> dict[str, object]:
        """Flat fields for a structured log event."""
        return {
            "exit_kind": self.kind.value,
            "exit_reason": self.reason,
            "exit_code": self.code,
            "exit_signal": self.signal,
            "cgroup_oom_kills": self.cgroup_oom_kills,
            "uptime_s": round(self.uptime_s, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
        }


_ADDR_IN_USE_MARKERS = ("address already in use", "address in use", "addrinuse")


def _signal_name(signum: int) -> str:
    try:
        return Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _start_failure_reason(facts: ExitFacts) -> str:
    if facts.start_error:
        return facts.start_error
    lowered = [line.lower() for line in facts.last_lines]
    if any(marker in line for line in lowered for marker in _ADDR_IN_USE_MARKERS):
        return "address in use"
    last = facts.last_lines[-1] if facts.last_lines else "no output"
    if facts.returncode is not None and facts.returncode < 0:
        return f"killed by {_signal_name(-facts.returncode)} before ready (last line: {last})"
    return f"exited with code {facts.returncode} before ready (last line: {last})"


def classify_exit(facts: ExitFacts) -> DaemonExit:
    """Turn the observed facts of one daemon run into a ``DaemonExit``."""
    oom_delta = 0
    if facts.oom_kills_before is not None and facts.oom_kills_after is not None:
        oom_delta = max(0, facts.oom_kills_after - facts.oom_kills_before)

    uptime, peak = facts.uptime_s, facts.peak_rss_bytes
    made = partial(DaemonExit, cgroup_oom_kills=oom_delta, uptime_s=uptime, peak_rss_bytes=peak)

    rc = facts.returncode
    sig = -rc if rc is not None and rc < 0 else None
    # The kernel's OOM killer uses SIGKILL; so do we after a stop grace, which is not an OOM.
    # The cgroup counter is evidence even while we were stopping it; the watcher's hint is not.
    oom_evidence = oom_delta or (facts.memory_at_limit and not facts.stop_requested)
    if sig == Signals.SIGKILL and oom_evidence:
        why = f"cgroup oom_kill counter +{oom_delta}" if oom_delta else "memory at the limit"
        return made(ExitKind.OOM_KILLED, f"killed by SIGKILL, out of memory ({why})", signal=sig)
    if not facts.was_ready and not facts.stop_requested:
        reason = _start_failure_reason(facts)
        permanent = bool(facts.start_error) or reason == "address in use"
        code = rc if rc is not None and rc >= 0 else None
        return made(ExitKind.FAILED_TO_START, reason, code=code, signal=sig, permanent=permanent)
    if facts.unresponsive:
        return made(ExitKind.KILLED, facts.unresponsive, signal=sig)
    if sig is not None:
        if facts.stop_requested:
            return made(ExitKind.CLEAN, f"stopped by us ({_signal_name(sig)})", signal=sig)
        return made(ExitKind.KILLED, f"killed by {_signal_name(sig)}", signal=sig)
    if rc == 0 or facts.stop_requested:
        why = "exited cleanly" if rc == 0 else f"stopped by us (code {rc})"
        return made(ExitKind.CLEAN, why, code=rc)
    last = facts.last_lines[-1] if facts.last_lines else "no output"
    return made(ExitKind.CRASHED, f"exited with code {rc} (last line: {last})", code=rc)
