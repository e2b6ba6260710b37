"""The supervisor in the run phase: its memory (RSS, PSS, USS, where the RSS lies, what its
imports cost) and its idle CPU, sampled over a window while it keeps the daemon up.

The run phase is where the supervisor spends its days beside the daemon on every machine of
the fleet (0.1 % of a core, and docs/architecture.md, rule 11's memory: the supervisor's own share
above its dependencies' floor, the reference row with grpc, at most 11 MiB; issue 35's 45 MiB total
is a row, not the target). ``sample`` reads the process alone (not the daemon, not its other
children); ``rows`` turns a sample into the table's rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import _memory
import psutil
from _harness import Row, at_most, failed, info

MIB = 1 << 20
OWN_SHARE_TARGET_MIB = 11.0
"""docs/architecture.md, rule 11: the run phase's RSS above the floor row, the supervisor's own
share."""
CPU_TARGET_PCT = 0.1
OWN_SHARE = "supervisor's own share, max RSS above its floor (the reference row with grpc)"


@dataclass
class RunPhase:
    window_s: float
    cpu_s: float
    rss_max: int
    rss_start: int
    rss_end: int
    pss: int
    uss: int
    resident: _memory.Resident
    modules: list[str] = field(default_factory=list)
    """What the process had in ``sys.modules`` at its exit (tests/loadedmodules.py)."""

    @property
    def cpu_pct(self) -> float:
        return 100 * self.cpu_s / self.window_s


def sample(pid: int, hold_s: float) -> RunPhase:
    """RSS every 0.25 s and CPU (user + system, all its threads) over ``hold_s``; PSS, USS and
    where the RSS lies at the window's end."""
    proc = psutil.Process(pid)
    rss: list[int] = []
    t0, c0 = time.monotonic(), proc.cpu_times()
    deadline = t0 + hold_s
    while (now := time.monotonic()) < deadline:
        rss.append(proc.memory_info().rss)
        time.sleep(min(0.25, deadline - now))
    rss.append(proc.memory_info().rss)
    t1, c1 = time.monotonic(), proc.cpu_times()
    full = proc.memory_full_info()
    return RunPhase(
        window_s=t1 - t0, cpu_s=(c1.user - c0.user) + (c1.system - c0.system),
        rss_max=max(rss), rss_start=rss[0], rss_end=rss[-1], pss=full.pss, uss=full.uss,
        resident=_memory.resident(pid),
    )  # fmt: skip


def _mib(size: int) -> float:
    return size / MIB


def memory_rows(label: str, rss_max_mib: float, floor_mib: float) -> list[Row]:
    """The run phase's memory as judged (docs/architecture.md, rule 11): its max RSS shown, its
    share
    above the floor row held to ``OWN_SHARE_TARGET_MIB``."""
    return [
        info(f"{label}: supervisor max RSS", rss_max_mib, "MiB"),
        at_most(f"{label}: {OWN_SHARE}", rss_max_mib - floor_mib, "MiB", OWN_SHARE_TARGET_MIB),
    ]


def rows(
    phase: RunPhase | None, field_c1: RunPhase | None, notes: list[str], why: str
) -> list[Row]:
    """The run phase's rows; ``field_c1``: a run whose proofs sent a field-size C1."""
    if phase is None:
        return [
            failed(f"run phase: {OWN_SHARE}", "MiB", f"<= {OWN_SHARE_TARGET_MIB:g}", why),
            failed("run phase: supervisor idle CPU", "% core", f"<= {CPU_TARGET_PCT:g}", why),
        ]
    window = f"{phase.window_s:.0f} s"
    floor = _mib(_memory.floor())
    out = [
        *memory_rows(f"run phase ({window})", _mib(phase.rss_max), floor),
        info("run phase: supervisor PSS", _mib(phase.pss), "MiB"),
        info("run phase: supervisor USS", _mib(phase.uss), "MiB"),
        at_most(f"run phase: supervisor idle CPU ({window})", phase.cpu_pct, "% core",
                CPU_TARGET_PCT),
        info("run phase: supervisor RSS growth over window",
             _mib(phase.rss_end - phase.rss_start), "MiB"),
    ]  # fmt: skip
    resident = phase.resident
    for label, size in sorted(resident.libraries.items(), key=lambda item: -item[1]):
        out.append(info(f"  RSS in: {label}", _mib(size), "MiB"))
    out.append(info("  RSS in: Python objects and malloc (anonymous, [heap])",
                    _mib(resident.heap), "MiB"))  # fmt: skip
    out.append(info(f"  RSS in: threads' stacks ({resident.threads} threads)",
                    _mib(resident.stacks), "MiB"))  # fmt: skip
    if phase.modules:
        for package, size in _memory.imports_by_package(phase.modules):
            out.append(info(f"  imports, fresh interpreter: {package}", _mib(size), "MiB"))
        size, need_grpc = _memory.imports_without_grpc(phase.modules)
        label = f"grpc blocked ({len(need_grpc)} modules fail: those that need it)"
        out.append(info(f"  imports, fresh interpreter, {label}", _mib(size), "MiB"))
        notes.append("run phase: the modules that cannot be imported without grpc: "
                     + (", ".join(need_grpc) or "none"))  # fmt: skip
    out.append(info("  reference: a bare process holding only asyncio (+ ssl), structlog, psutil"
                    " and grpc.aio with one channel (the floor)", floor, "MiB"))  # fmt: skip
    out.append(info("  reference: the same without grpc (protobuf and the proving messages kept)",
                    _mib(_memory.floor(with_grpc=False)), "MiB"))  # fmt: skip
    if field_c1 is not None:
        out += memory_rows("run phase, proofs of a field-size C1 (51 MB)",
                           _mib(field_c1.rss_max), floor)  # fmt: skip
    notes.append(
        f"run phase window: RSS {_mib(phase.rss_start):.1f} -> {_mib(phase.rss_end):.1f} MiB "
        f"(max {_mib(phase.rss_max):.1f}), PSS {_mib(phase.pss):.1f}, USS {_mib(phase.uss):.1f};"
        f" CPU {phase.cpu_s:.3f} s in {phase.window_s:.1f} s (the supervisor process alone: user"
        " + system of all its threads, children excluded); product defaults for"
        " memory_sample_interval_s (1), status_interval_s (60), daemon_liveness_interval_s (30),"
        " health_interval_s (30); health server and log push on. 'RSS in': /proc/PID/smaps at"
        " the window's end (the parts add up to the RSS). 'imports, fresh interpreter': the"
        f" {len(phase.modules)} modules the run loaded, imported again a package at a time in a"
        " new interpreter, what each added to its RSS (an estimate: shared dependencies count"
        " for the first package that needs them; the run's own data is not in it)"
    )
    return out
