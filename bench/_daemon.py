"""Figures from ``supervisor daemon --workers 2``: crash detection, readiness, log throughput."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _settings as cfg
import psutil
from _harness import (
    BenchError,
    Processes,
    Row,
    SupervisorProc,
    at_least,
    at_most,
    event_ts,
    failed,
    info,
    median,
    p95,
    read_daemon_log,
)

SERVING = "cuzk-daemon ready, serving on"
FLOOD_RE = re.compile(rb"sim log flood n=(\d+)")
CRASH_TARGET_MS = 50.0
READY_TARGET_MS = 300.0
FLOOD_TARGET = 20_000.0
FLOOD_OFFERED = 50_000
FLOOD_PROBE = 200_000


def _ready_with_pid(sup: SupervisorProc, seen: set[int], timeout: float) -> dict[str, Any]:
    """The next ``daemon.ready`` of DaemonProcess (it carries the pid) for a pid not seen yet."""
    return sup.wait_for(
        lambda e: e.get("event") == "daemon.ready" and "pid" in e and int(e["pid"]) not in seen,
        timeout,
        "daemon.ready of a new daemon",
    )


def _exit_of(pid: int) -> Callable[[dict[str, Any]], bool]:
    """Accepts the ``daemon.exited`` event of ``pid``."""
    return lambda e: e.get("event") == "daemon.exited" and e.get("pid") == pid


def crash_and_readiness(
    procs: Processes,
    root: Path,
    time_scale: float,
    kills: int,
    wanted: set[str],
    notes: list[str],
    memory_scale: float = 1.0,
) -> list[Row]:
    """SIGKILL the ready daemon ``kills`` times; every start is also a readiness sample.
    ``memory_scale``: the sim's real MiB per simulated GiB (``_settings.common``)."""
    env = cfg.daemon_only(root, time_scale, memory_scale=memory_scale)
    sup = SupervisorProc(procs, "daemon", env, ["--workers", str(cfg.WORKERS)])
    crash_ms: list[float] = []
    ready_events: list[dict[str, object]] = []
    seen: set[int] = set()
    problem = ""
    try:
        for _ in range(kills + 1):
            ready = _ready_with_pid(sup, seen, 60)
            pid = int(str(ready["pid"]))
            seen.add(pid)
            procs.note(pid)
            ready_events.append(ready)
            if len(ready_events) > kills:
                break
            time.sleep(0.2)  # let it settle idle, as a crash would find it
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            exited = sup.wait_for(
                _exit_of(pid),
                30,
                f"daemon.exited pid={pid}",
            )
            crash_ms.append(1000 * (event_ts(exited) - killed_at))
        stop_s, rc = sup.stop()
        notes.append(
            f"`supervisor daemon` SIGTERM -> exit after the kills: {stop_s:.3f} s, rc {rc}"
        )
    except BenchError as exc:
        problem = str(exc)
        notes.append(f"crash/readiness: {problem}")
    rows: list[Row] = []
    if "crash" in wanted:
        name = f"crash detection (SIGKILL -> daemon.exited), median of {len(crash_ms)}"
        if not crash_ms:
            rows.append(failed(name, "ms", f"<= {CRASH_TARGET_MS:g}", problem))
        else:
            rows.append(at_most(name, median(crash_ms), "ms", CRASH_TARGET_MS))
            rows.append(info("crash detection, p95", p95(crash_ms), "ms"))
            notes.append("crash detection samples (ms): " + ", ".join(f"{v:.1f}" for v in crash_ms))
    if "readiness" in wanted:
        calls = [int(e["calls"]) for e in sup.named("daemon.ready") if "calls" in e]
        rows.extend(_readiness_rows(root / "log", ready_events, calls, notes, problem))
    return rows


def _readiness_rows(
    log_dir: Path,
    ready_events: list[dict[str, object]],
    calls: list[int],
    notes: list[str],
    problem: str,
) -> list[Row]:
    """Each start: the sim's "ready, serving on" line (unix socket: bound before it is printed)
    to the supervisor's ``daemon.ready``. The sim does not log its first answered GetStatus."""
    name = "readiness (sim 'serving' line -> daemon.ready), median"
    serving = [ln.ts for ln in read_daemon_log(log_dir) if SERVING in ln.text]
    if not ready_events or len(serving) < len(ready_events):
        why = problem or f"{len(serving)} serving lines for {len(ready_events)} starts"
        return [failed(name, "ms", f"<= {READY_TARGET_MS:g}", why)]
    latencies = [1000 * (event_ts(ev) - ts) for ev, ts in zip(ready_events, serving, strict=False)]
    startup = [float(str(ev.get("startup_s", "nan"))) for ev in ready_events]
    notes.append(
        f"readiness: {len(latencies)} starts; samples (ms) "
        + ", ".join(f"{v:.0f}" for v in latencies)
        + f"; spawn -> ready (startup_s) median {median(startup):.3f} s; GetStatus calls per"
        f" start {sorted(set(calls))}; the supervisor waits for the port with plain"
        " connects every 25 ms, then calls GetStatus"
    )
    return [
        at_most(f"{name} of {len(latencies)}", median(latencies), "ms", READY_TARGET_MS),
        info("readiness, p95", p95(latencies), "ms"),
    ]


def _last_flood_n(path: Path) -> int:
    """The highest flood counter at the end of the live log file (-1 if none yet)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            tail = handle.read()
    except FileNotFoundError:
        return -1
    found = FLOOD_RE.findall(tail)
    return int(found[-1]) if found else -1


FLOOD_PATIENCE_S = 30.0
"""How long a flood window waits for its counter to move before it measures nothing."""


def _flood_n_past(path: Path, floor: int, within_s: float) -> int:
    """The flood counter once it is past ``floor`` (polled), or as it is after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (n := _last_flood_n(path)) <= floor and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def log_throughput(
    procs: Processes,
    root: Path,
    time_scale: float,
    window_s: float,
    notes: list[str],
    offered: int = FLOOD_OFFERED,
) -> list[Row]:
    """A daemon flooding ``offered`` lines/s; the rate at which lines reach cuzk.log."""
    name = f"log throughput carried (offered {offered:,}/s)"
    env = cfg.daemon_only(root, time_scale, (f"flood:{offered}",))
    sup = SupervisorProc(procs, "daemon", env, ["--workers", str(cfg.WORKERS)])
    log_path = root / "log" / "cuzk.log"
    try:
        ready = _ready_with_pid(sup, set(), 60)
        procs.note(int(ready["pid"]))
        time.sleep(0.5)  # past the flood's first ticks
        proc = psutil.Process(sup.pid)
        # The window starts and ends at counters read as they move: on a starved machine (a CPU
        # quota, other work) nothing may reach the file for a while, and the window then lasts
        # until something does, rather than measuring nothing.
        n1 = _flood_n_past(log_path, -1, FLOOD_PATIENCE_S)
        t1, c1 = time.monotonic(), proc.cpu_times()
        time.sleep(window_s)
        n2 = _flood_n_past(log_path, n1, FLOOD_PATIENCE_S)
        t2, c2 = time.monotonic(), proc.cpu_times()
        stop_s, rc = sup.stop()
    except BenchError as exc:
        notes.append(f"log throughput: {exc}")
        return [failed(name, "lines/s", f">= {FLOOD_TARGET:g}", str(exc))]
    if n1 < 0 or n2 <= n1:
        return [failed(name, "lines/s", f">= {FLOOD_TARGET:g}", f"counter {n1} -> {n2}")]
    rate = (n2 - n1) / (t2 - t1)
    cpu_pct = 100 * ((c2.user - c1.user) + (c2.system - c1.system)) / (t2 - t1)
    numbers: list[int] = []
    for path in sorted((root / "log").glob("cuzk.log*")):
        numbers.extend(int(n) for n in FLOOD_RE.findall(path.read_bytes()))
    unique = set(numbers)
    top = max(unique) if unique else -1
    missing = top + 1 - len(unique)
    dupes = len(numbers) - len(unique)
    notes.append(
        f"log throughput: counter {n1} -> {n2} in {t2 - t1:.2f} s (window {window_s:g} s, longer"
        f" where the counter stood still); {len(numbers):,} flood lines in"
        f" cuzk.log*, n=0..{top}: {missing} missing, {dupes} duplicated; supervisor CPU"
        f" {cpu_pct:.0f}% of a core while carrying; stopped in {stop_s:.3f} s (rc {rc}); only"
        f" the offered rate can be carried: a figure at the offered rate is a lower bound of the"
        f" capacity"
    )
    return [
        at_least(name, rate, "lines/s", FLOOD_TARGET),
        Row("log lines lost (missing n=, whole run)", float(missing + dupes), "lines", "= 0",
            missing + dupes == 0),
        info("supervisor CPU while carrying the flood", cpu_pct, "% core"),
    ]  # fmt: skip


def log_throughput_probe(
    procs: Processes, root: Path, time_scale: float, window_s: float, notes: list[str]
) -> list[Row]:
    """The same at ``FLOOD_PROBE`` lines/s, informational: how far above the target it goes."""
    rows = log_throughput(procs, root, time_scale, window_s, notes, offered=FLOOD_PROBE)
    return [
        Row(f"  probe: {r.name}", r.value, r.unit, r.target if "lost" in r.name else "",
            r.ok if "lost" in r.name else None)
        for r in rows
    ]  # fmt: skip


LONG_START_KILLS = 3


def readiness_long_start(
    procs: Processes,
    root: Path,
    time_scale: float,
    kills: int,
    notes: list[str],
    memory_scale: float = 1.0,
) -> list[Row]:
    """Readiness again at a slower time scale (at 10 the SRS load takes ~4.5 s instead of
    ~0.45 s at 100), to show how the figure grows with the start's length; informational."""
    own: list[str] = []
    rows = crash_and_readiness(procs, root, time_scale, kills, {"readiness"}, own, memory_scale)
    notes.extend(f"long start (time scale {time_scale:g}): {n}" for n in own)
    return [
        Row(f"  long start (time scale {time_scale:g}): {r.name}", r.value, r.unit) for r in rows
    ]
