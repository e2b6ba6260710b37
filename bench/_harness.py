"""Shared machinery of ``bench/run.py``: rows, processes, log parsing, statistics.

Every process the suite starts goes through ``Processes``, which ends it (and whatever it left
behind) on the way out. Nothing here sleeps to synchronise except short polls with deadlines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")
PY = sys.executable
QUICK_TIME_SCALE = 1000.0
"""The simulator's time scale in a ``--quick`` run (unless ``--time-scale`` says otherwise): a
whole lifecycle in a few seconds. Its figures show that everything is still measured; they are
not for holding against the targets (at this scale the sim's own timer lateness shows)."""
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
MANAGER_READY_RE = re.compile(r"sim-manager listening on (http://\S+)")
# Environment prefixes a child must not inherit from whoever runs the bench.
FOREIGN_ENV = ("CUZK_SIM_", "CUZK_SUPERVISOR_", "VAST_", "MIN_RATE", "RUST_LOG", "NO_COLOR")


class BenchError(Exception):
    """A figure could not be measured (the reason goes into the report)."""


# --- rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One figure. ``target`` is text such as ``"<= 60"`` (empty: informational, ok None)."""

    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "ok": self.ok,
        }


def at_most(name: str, value: float | None, unit: str, limit: float) -> Row:
    ok = None if value is None else value <= limit
    return Row(name, value, unit, f"<= {limit:g}", ok)


def at_least(name: str, value: float | None, unit: str, limit: float) -> Row:
    ok = None if value is None else value >= limit
    return Row(name, value, unit, f">= {limit:g}", ok)


def info(name: str, value: float | None, unit: str) -> Row:
    return Row(name, value, unit)


NOT_MEASURED = "NOT MEASURED"
MISSED_EXIT = 3
"""A script's exit status when a row missed its target (1: a row not measured; 2: bad options,
as argparse answers them)."""


def failed(name: str, unit: str, target: str, reason: str) -> Row:
    """A figure that could not be measured: value None, ok False, the reason in the name."""
    return Row(f"{name} [{NOT_MEASURED}: {reason}]", None, unit, target, False)


def measured(row: Mapping[str, Any]) -> bool:
    """Whether a row (as written to ``--json``) holds a figure: a finite number for a value, and
    no ``NOT MEASURED`` in its name. ``tests/test_bench_quick.py`` reads rows the same way."""
    value = row.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return NOT_MEASURED not in str(row.get("name", "")).upper()


# --- the scripts' shared options and ending ---------------------------------------------------


def standard_options(parser: argparse.ArgumentParser, quick: str) -> None:
    """``--quick`` and ``--json FILE``, the two options every ``bench/*.py`` script takes."""
    parser.add_argument(
        "--quick", action="store_true", help=f"seconds, not minutes (every row still): {quick}"
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help='write the rows as a JSON list of {"name", "value", "unit", "target", "ok"}',
    )


def missed(row: Mapping[str, Any]) -> bool:
    """Whether a measured row (as written to ``--json``) missed its target: ``ok`` is false.
    ``tests/test_bench_quick.py`` fails on such a row, as :func:`finish` exits on one."""
    return measured(row) and row.get("ok") is False


def _never(target: str) -> bool:
    """A target of something that must never happen: a limit of 0 (``<= 0``, ``= 0``, ``0``)."""
    try:
        return float(target.strip().lstrip("<>=").split()[0]) == 0
    except (ValueError, IndexError):
        return False


def held(rows: Sequence[Row], quick: bool) -> list[Row]:
    """The rows as a run holds them to their targets. A full run holds every target. A quick
    run (seconds, a sample or two, a scale where the sim's timer lateness shows) holds only the
    targets of what must never happen whatever the scale: a limit of 0 (reports lost, instances
    ended, lines lost, reports applied twice); every other target is a full run's, shown as
    ``full run: ...`` and not judged (``ok`` None)."""
    if not quick:
        return list(rows)
    return [r if r.ok is None or _never(r.target) else unheld(r) for r in rows]


def unheld(row: Row) -> Row:
    """``row`` with its target shown as a full run's and not judged (``ok`` None)."""
    return Row(row.name, row.value, row.unit, f"full run: {row.target}", None)


def within(low: float, high: float) -> Callable[[str], float]:
    """An option's type: a number in ``[low, high]`` (argparse answers anything else with exit 2
    and the reason)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value:g} is outside {low:g}-{high:g}")
        return value

    return parse


def finish(rows: Sequence[Row], json_path: Path | None) -> int:
    """Write ``--json``; the exit status: 0 when every row holds a figure and meets its target,
    1 when one could not be measured, ``MISSED_EXIT`` when one missed its target (a ``NO``)."""
    document = [r.as_dict() for r in rows]
    if json_path is not None:
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    missing = [d["name"] for d in document if not measured(d)]
    if missing:
        print(f"{len(missing)} row(s) not measured: {'; '.join(missing)}", file=sys.stderr)
        return 1
    short = [d["name"] for d in document if missed(d)]
    if short:
        print(f"{len(short)} row(s) missed their target: {'; '.join(short)}", file=sys.stderr)
        return MISSED_EXIT
    return 0


def progress_printer(tag: str) -> Callable[[str], None]:
    """A script's progress lines: ``[TAG HH:MM:SS] message`` on stderr (stdout holds the table)."""

    def progress(message: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return progress


def report(rows: Sequence[Row], notes: Sequence[str], json_path: Path | None, quick: bool) -> int:
    """The scripts' ending: the rows as the run holds them (:func:`held`), the table, the notes
    as ``- `` lines, the rows as one JSON line, then :func:`finish` (``--json FILE`` and the
    exit status)."""
    rows = held(rows, quick)
    print_table(rows)
    for note in notes:
        print(f"- {note}")
    print(json.dumps([row.as_dict() for row in rows]))
    return finish(rows, json_path)


def fmt_value(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return (
            f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 1000 else f"{value:.1f}"
        )
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def print_table(rows: Sequence[Row]) -> None:
    width = max([len("name"), *(len(r.name) for r in rows)])
    print(f"{'name':<{width}}  {'value':>10}  {'unit':<9} {'target':<10} ok")
    for r in rows:
        ok = "-" if r.ok is None else ("yes" if r.ok else "NO")
        print(f"{r.name:<{width}}  {fmt_value(r.value):>10}  {r.unit:<9} {r.target:<10} {ok}")


# --- statistics ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile (the maximum for fewer than 20 samples)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


# --- time and logs ---------------------------------------------------------------------------


def parse_ts(text: str) -> float:
    """An ISO-8601 timestamp (``...Z`` or with an offset) as epoch seconds."""
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def event_ts(event: Mapping[str, Any]) -> float:
    return parse_ts(str(event["timestamp"]))


@dataclass(frozen=True)
class DaemonLine:
    """One line of ``log_dir/cuzk.log`` with the simulated daemon's own timestamp."""

    ts: float
    text: str


def read_daemon_log(log_dir: Path) -> list[DaemonLine]:
    """Every line of ``cuzk.log`` and its rotations, oldest first, with a leading timestamp."""
    files = sorted(log_dir.glob("cuzk.log.*"), key=lambda p: -int(p.suffix[1:] or 0))
    files.append(log_dir / "cuzk.log")
    lines: list[DaemonLine] = []
    for path in files:
        if not path.exists():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            text = ANSI_RE.sub("", raw)
            stamp, _, _ = text.partition(" ")
            try:
                lines.append(DaemonLine(parse_ts(stamp), text))
            except ValueError:
                continue
    return lines


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def poll_until(
    check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def compile_package() -> None:
    """Compile the package's bytecode, as the image's ``pip install`` does: a supervisor that
    compiles its modules at each start (stale or missing ``__pycache__`` and
    ``PYTHONDONTWRITEBYTECODE`` set, as in a development tree) is not the one deployed."""
    import compileall

    import cuzk_supervisor

    compileall.compile_dir(str(Path(cuzk_supervisor.__file__).parent), quiet=1)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
    return {**base, **extra}


# --- processes -------------------------------------------------------------------------------


class Processes:
    """Every process the suite starts; ``close`` ends them all and anything they left.

    Descendants are remembered as they are seen (``note``), because a daemon in its own session
    is re-parented away from us once its supervisor is gone. ``marker`` (the run's unique
    temporary folder) finds leftovers nobody noted: they mention it on their command line.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.popens: list[subprocess.Popen[bytes]] = []
        self.noted: list[psutil.Process] = []
        self.leftovers: list[str] = []

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
        )
        self.popens.append(proc)
        return proc

    def note(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self.noted.append(psutil.Process(pid))

    def note_tree(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(psutil.Error):
            self.noted.extend(psutil.Process(proc.pid).children(recursive=True))

    def close(self) -> None:
        for proc in self.popens:
            if proc.poll() is None:
                self.note_tree(proc)
                proc.send_signal(signal.SIGTERM)
        for proc in self.popens:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        time.sleep(0.2)  # a stopped supervisor's own cleanup has finished by now
        alive = {p.pid: p for p in self.noted if _alive(p)}
        alive.update((p.pid, p) for p in self._marked())
        for child in alive.values():
            with contextlib.suppress(psutil.Error):
                self.leftovers.append(f"pid {child.pid}: {' '.join(child.cmdline())[:160]}")
                child.kill()
        self.noted.clear()

    def _marked(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                    continue
                if any(self.marker in part for part in proc.info["cmdline"] or ()):
                    found.append(proc)
            except psutil.Error:
                continue
        return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


BUSY_LOOP = "while True: pass"


def busy_loops(procs: Processes, count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that spin a core each, at this process's priority (a supervisor's
    started from here: the same nice value); they carry ``procs.marker`` to be found."""
    return [procs.spawn([PY, "-c", BUSY_LOOP, procs.marker], child_env({})) for _ in range(count)]


class Waiter:
    """Records when a process exits (a blocking ``wait`` in a thread: no polling delay)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.exited_at: float | None = None
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def join(self, timeout: float) -> float:
        self._thread.join(timeout)
        if self.exited_at is None:
            raise BenchError(f"process {self.proc.pid} still running after {timeout:g} s")
        return self.exited_at


class SupervisorProc:
    """``python -m cuzk_supervisor COMMAND`` with JSON events read from stderr as they come."""

    def __init__(
        self,
        procs: Processes,
        command: str,
        env: Mapping[str, str],
        args: Sequence[str] = (),
        wrapper: Sequence[str] = (),
    ) -> None:
        """``wrapper``: what runs ``PY -m cuzk_supervisor ...`` in its own process (e.g.
        ``tests/loadedmodules.py``, which lists the modules loaded at exit)."""
        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        argv = [*wrapper, PY, "-m", "cuzk_supervisor", command, *args]
        self.proc = procs.spawn(argv, child_env(env))
        self.events: list[dict[str, Any]] = []
        self.plain: list[str] = []
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._drain_stdout, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.waiter = Waiter(self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_events(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cond:
                try:
                    self.events.append(json.loads(line))
                except json.JSONDecodeError:
                    self.plain.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.plain.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("event") == name]

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str, after: int = 0
    ) -> dict[str, Any]:
        """The first event at index >= ``after`` that ``predicate`` accepts."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[after:]:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    raise BenchError(
                        f"no {what} within {timeout:g} s (rc={self.proc.poll()}); "
                        f"last events: {[e.get('event') for e in self.events[-8:]]}; "
                        f"plain: {self.plain[-3:]}"
                    )
                self._cond.wait(min(left, 0.1))

    def wait_event(self, name: str, timeout: float, **fields: Any) -> dict[str, Any]:
        return self.wait_for(
            lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items()),
            timeout,
            f"event {name} {fields or ''}".rstrip(),
        )

    def dump(self, path: Path) -> None:
        """The events as JSON lines, for a look afterwards (``--keep``)."""
        with self._cond:
            path.write_text("".join(json.dumps(e) + "\n" for e in self.events))

    def stop(self, timeout: float = 20.0) -> tuple[float, int]:
        """SIGTERM; (seconds to exit, exit code)."""
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        exited = self.waiter.join(timeout)
        for thread in self._threads:
            thread.join(5)
        return exited - sent, int(self.proc.returncode)


class Manager:
    """The simulated manager on a free loopback port."""

    def __init__(self, procs: Processes, db: Path) -> None:
        argv = [PY, "-m", "cuzk_supervisor.sim.manager", "--db", str(db), "--listen", "127.0.0.1:0"]
        env = {k: v for k, v in child_env({}).items() if not k.startswith("CUZK_SIM_MANAGER_")}
        self.proc = procs.spawn(argv, env)
        self._lines: list[str] = []
        self._cond = threading.Condition()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        line = self._wait_line(MANAGER_READY_RE, 20.0)
        match = MANAGER_READY_RE.search(line)
        assert match is not None
        self.url = match.group(1)

    def _read(self, stream: Any) -> None:
        for raw in stream:
            with self._cond:
                self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()

    def _wait_line(self, regex: re.Pattern[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self._lines:
                    if regex.search(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise BenchError(f"sim manager not listening: {self._lines[-5:]}")
                self._cond.wait(min(left, 0.1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
