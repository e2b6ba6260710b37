"""The entrypoint's weight: import time, the run phase's RSS and PSS, the stop after SIGTERM.

    .venv/bin/python bench/entrypoint.py [--imports N] [--stops K] [--hold S] [--quick]
                                         [--time-scale S] [--json FILE] [--keep]

Figures (issue 16.6):
  import      wall time of ``python -c "import cuzk_supervisor.cli.main"`` (the entrypoint),
              of ``python -c "import <main>; import <run>"`` (what ``run`` imports before its
              first line) and of ``python -m cuzk_supervisor run --help``, median of N runs each,
              interpreter start included (``python -c pass`` is shown apart); the ``-X
              importtime`` total of the entrypoint; what ``run --help`` loads of the heavy
              packages (grpc, protobuf, prometheus_client, httpx, rich, the simulator);
  run phase   RSS and PSS (``psutil.Process.memory_full_info``) of the supervisor process alone,
              not its children: ``cuzk-supervisor run`` against the simulated manager and daemon
              (as ``bench/run.py`` runs it: health server and log push on), sampled from its
              ``phase.entered run`` event for ``--hold`` seconds; the max of the samples;
  stop        SIGTERM to the process's exit (a blocking wait in a thread), in the run phase of K
              such lifecycles, median; the exit codes go into the notes (143 expected).
Progress goes to stderr; a JSON line of the rows, then the table and notes, to stdout;
``--json FILE`` also writes the rows as [{"name", "value", "unit", "target", "ok"}].
``--quick``: 1 run per import (no untimed run before), 1 lifecycle (a second if the first
fails; a batch of 6 proofs, the sim's memory at an eighth), a 1 s window, the sim at time scale
1000, the imports and the lifecycle side by side (a check that every figure is still measured,
not figures for the targets). Exit 0 when every row holds a figure and meets its target, 1 when one
is NOT MEASURED, 3 when a target is missed (a quick run holds only the targets of what must never
happen: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _memory
import _runphase
import _settings as cfg
import psutil
from _harness import (
    PY,
    QUICK_TIME_SCALE,
    BenchError,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    at_most,
    child_env,
    compile_package,
    event_ts,
    failed,
    finish,
    held,
    info,
    median,
    print_table,
    progress_printer,
    standard_options,
)

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
QUICK_BENCH_COUNT = (
    6  # --quick: the lifecycle's batch (its figures are the run phase's and the stop)
)
ENTRY = "cuzk_supervisor.cli.main"
RUN_MODULE = "cuzk_supervisor.cli.commands.run"
IMPORT_TARGET_S = 0.25
STOP_TARGET_S = 0.05
# Packages only some commands need: none of them belongs to ``run --help``.
HEAVY = (
    "grpc", "google.protobuf", "prometheus_client", "httpx", "rich", "structlog",
    "cuzk_supervisor.sim", "cuzk_supervisor.cli.doctor", "cuzk_supervisor.proto",
    "cuzk_supervisor.lifecycle",
)  # fmt: skip
_LOADED = (
    "import sys, runpy\n"
    "sys.argv = ['cuzk-supervisor', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('cuzk_supervisor', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stdout.flush()\n"
    "sys.stderr.write('\\nLOADED ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
)


progress = progress_printer("entrypoint")


# --- import time -----------------------------------------------------------------------------


def _timed(
    argv: list[str], runs: int, ok_codes: tuple[int, ...] = (0,), warm: bool = True
) -> tuple[float, float]:
    """Median wall and CPU seconds (the child's user + system) of ``runs`` runs of ``argv``,
    after one untimed run that warms the caches (``warm``). CPU time barely moves when other
    work shares the machine; wall time does."""
    env = child_env({})
    walls, cpus = [], []
    for i in range(0 if warm else 1, runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, env=env, cwd=REPO)
        elapsed = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in ok_codes:
            raise BenchError(f"{' '.join(argv[1:])}: rc {done.returncode}: {done.stderr[-300:]!r}")
        if i:
            walls.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return median(walls), median(cpus)


def importtime_total_s(module: str) -> float:
    """The ``-X importtime`` total of ``import module``: the sum of the top-level cumulative
    times (what the import itself loaded, interpreter start and ``site`` excluded)."""
    done = subprocess.run(
        [PY, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True, text=True, env=child_env({}), cwd=REPO,
    )  # fmt: skip
    total_us = 0
    after_site = False
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line, or not an importtime line
        top_level = not parts[2].startswith("  ")
        if top_level and after_site:
            total_us += int(parts[1])
        elif top_level and parts[2].strip() == "site":
            after_site = True  # what came before is the interpreter's own start
    return total_us / 1e6


def loaded_by(args: list[str]) -> set[str]:
    """The modules loaded by ``cuzk-supervisor ARGS`` (run in a fresh interpreter)."""
    done = subprocess.run(
        [PY, "-c", _LOADED, *args], capture_output=True, text=True, env=child_env({}), cwd=REPO
    )
    for line in reversed(done.stderr.splitlines()):
        if line.startswith("LOADED "):
            return set(line.split()[1:])
    raise BenchError(f"no module list from {args}: {done.stderr[-300:]!r}")


def heavy_in(modules: set[str]) -> list[str]:
    return [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]


# (label, argv after the interpreter, exit codes that are fine, whether the target applies)
IMPORT_CASES: tuple[tuple[str, list[str], tuple[int, ...], bool], ...] = (
    (f"import {ENTRY}", ["-c", f"import {ENTRY}"], (0,), True),
    (f"import {ENTRY} + {RUN_MODULE}", ["-c", f"import {ENTRY}; import {RUN_MODULE}"], (0,), True),
    ("cuzk-supervisor run --help", ["-m", "cuzk_supervisor", "run", "--help"], (0,), True),
    ("cuzk-supervisor --help", ["-m", "cuzk_supervisor", "--help"], (0,), False),
    (
        "cuzk-supervisor healthcheck (nothing listening)",
        ["-m", "cuzk_supervisor", "healthcheck", "--health-listen", "127.0.0.1:9"],
        (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        False,
    ),
    ("python -c pass (interpreter start)", ["-c", "pass"], (0,), False),
)


def import_rows(runs: int, notes: list[str], warm: bool = True) -> list[Row]:
    rows = []
    for label, argv, ok_codes, targeted in IMPORT_CASES:
        wall, cpu = _timed([PY, *argv], runs, ok_codes, warm)
        name = f"{label} (wall, median of {runs})"
        rows.append(
            at_most(name, wall, "s", IMPORT_TARGET_S) if targeted else info(name, wall, "s")
        )
        rows.append(info(f"{label} (CPU)", cpu, "s"))
    rows.append(info(f"-X importtime total of {ENTRY}", importtime_total_s(ENTRY), "s"))
    for args in (["--help"], ["config"], ["run", "--help"], ["sim", "--help"]):
        modules = loaded_by(args)
        heavy = heavy_in(modules)
        rows.append(info(f"modules loaded by `{' '.join(args)}`", len(modules), "modules"))
        notes.append(f"`{' '.join(args)}` loads of the heavy parts: {', '.join(heavy) or 'none'}")
    run_modules = _graph(RUN_MODULE)
    notes.append(
        f"`run`'s import graph ({RUN_MODULE}) loads: {', '.join(heavy_in(run_modules)) or 'none'}"
    )
    notes.append(
        "import times: median of each command's runs"
        + (" after one untimed run" if warm else " (no untimed run first: cold caches)")
        + ", interpreter start included; CPU: the child's user + system time (what other work on"
        " the machine does not inflate); -X importtime total: the sum of the top-level cumulative"
        " times, site excluded"
    )
    return rows


def _graph(module: str) -> set[str]:
    code = f"import sys; import {module}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=child_env({}))
    return set(done.stdout.split())


# --- run phase and stop ----------------------------------------------------------------------


def _sample(pid: int, hold_s: float) -> tuple[float, float, float]:
    """Max RSS, PSS and USS (MiB) of ``pid`` alone over ``hold_s`` seconds."""
    proc = psutil.Process(pid)
    rss, pss, uss = [], [], []
    deadline = time.monotonic() + hold_s
    while True:
        full = proc.memory_full_info()
        rss.append(full.rss)
        pss.append(full.pss)
        uss.append(full.uss)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(0.25, left))
    return max(rss) / MIB, max(pss) / MIB, max(uss) / MIB


def lifecycle_rows(
    root: Path,
    stops: int,
    hold_s: float,
    time_scale: float,
    notes: list[str],
    spare: int = 0,
    quick: bool = False,
) -> list[Row]:
    """``stops`` lifecycles, and up to ``spare`` more while none could be stopped (a quick run,
    on a loaded machine); the first to reach the run phase is sampled. ``quick``: a batch of
    ``QUICK_BENCH_COUNT``, the sim's memory at ``QUICK_MEMORY_SCALE``."""
    procs = Processes(str(root))
    memory: tuple[float, float, float] | None = None
    samples: list[float] = []
    to_last: list[float] = []
    codes: list[int] = []
    problems: list[str] = []
    try:
        manager = Manager(procs, root / "manager.db")
        try:
            i = 0
            while i < stops or (not samples and i < stops + spare):
                life = root / f"life{i}"
                life.mkdir(parents=True)
                memory_scale = cfg.QUICK_MEMORY_SCALE if quick else 1.0
                env = cfg.lifecycle(life, manager.url, time_scale, memory_scale)
                if quick:
                    env["CUZK_SUPERVISOR_BENCH_COUNT"] = str(QUICK_BENCH_COUNT)
                sup = SupervisorProc(procs, "run", env)
                try:
                    sup.wait_event("phase.entered", 300, phase="run")
                    for spawned in sup.named("daemon.spawned"):
                        procs.note(int(spawned["pid"]))
                    if memory is None:
                        memory = _sample(sup.pid, hold_s)
                    sent = time.time()
                    stop_s, code = sup.stop()
                    samples.append(stop_s)
                    codes.append(code)
                    if sup.events:  # the last line's own timestamp against the signal's
                        to_last.append(max(0.0, event_ts(sup.events[-1]) - sent))
                except BenchError as exc:
                    problems.append(f"lifecycle {i}: {exc}")
                progress(f"lifecycle {i + 1}/{stops} done")
                i += 1
        finally:
            manager.stop()
    finally:
        procs.close()
    notes.extend(problems)
    if procs.leftovers:
        notes.append("LEFT BEHIND (killed by the bench): " + "; ".join(procs.leftovers))
    why = "; ".join(problems) or "no run"
    rows: list[Row] = []
    if memory is None:
        target = f"<= {_runphase.OWN_SHARE_TARGET_MIB:g}"
        rows.append(failed(f"run phase: {_runphase.OWN_SHARE}", "MiB", target, why))
    else:
        rss, pss, uss = memory
        floor = _memory.floor() / MIB
        rows += _runphase.memory_rows(f"run phase ({hold_s:g} s)", rss, floor)
        rows.append(info("run phase: supervisor PSS (max)", pss, "MiB"))
        rows.append(info("run phase: supervisor USS (max)", uss, "MiB"))
    if not samples:
        rows.append(failed("stop (SIGTERM -> exit), median", "s", f"<= {STOP_TARGET_S:g}", why))
    else:
        name = f"stop (SIGTERM -> exit), median of {len(samples)}"
        rows.append(at_most(name, median(samples), "s", STOP_TARGET_S))
        rows.append(info("stop (SIGTERM -> exit), max", max(samples), "s"))
        if len(to_last) == len(samples):
            rows.append(info("  of it: SIGTERM -> last event line, median", median(to_last), "s"))
            after = [total - last for total, last in zip(samples, to_last, strict=True)]
            rows.append(info("  of it: last event line -> exit, median", median(after), "s"))
        notes.append(
            f"stop samples {', '.join(f'{s:.3f}' for s in samples)} s; exit codes {codes}; "
            "`run` in the run phase with health and log push on, the sim daemon stopped by it"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--imports", type=int, default=11, metavar="N", help="runs per import")
    parser.add_argument("--stops", type=int, default=5, metavar="K", help="lifecycles to stop")
    parser.add_argument("--hold", type=float, default=10.0, metavar="S", help="RSS window (s)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help=f"the sim's (default 100; {QUICK_TIME_SCALE:g} with --quick)",
    )
    standard_options(
        parser,
        f"1 run per import, 1 stop (a batch of {QUICK_BENCH_COUNT}, the sim's memory at an "
        f"eighth), 1 s window, time scale {QUICK_TIME_SCALE:g}",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    imports, stops, hold = (1, 1, 1.0) if args.quick else (args.imports, args.stops, args.hold)
    args.time_scale = args.time_scale or (QUICK_TIME_SCALE if args.quick else 100.0)
    compile_package()  # as the image's pip install does (see _harness.compile_package)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="cuzk-entry-"))
    rows: list[Row] = []
    notes: list[str] = [f"time scale {args.time_scale:g}; tmp {root}"]
    try:

        def imports_part(own: list[str]) -> list[Row]:
            progress(f"import times ({imports} runs each) ...")
            try:
                return import_rows(imports, own, warm=not args.quick)
            except BenchError as exc:
                return [failed("import time", "s", f"<= {IMPORT_TARGET_S:g}", str(exc))]

        def lifecycle_part(own: list[str]) -> list[Row]:
            progress(f"{stops} lifecycles (`cuzk-supervisor run`, run-phase window {hold:g} s) ...")
            spare = 1 if args.quick else 0
            return lifecycle_rows(root, stops, hold, args.time_scale, own, spare, args.quick)

        # A quick run runs the two side by side: its figures show that each is still measured,
        # they are not for the targets.
        def run_part(part: Callable[[list[str]], list[Row]]) -> tuple[list[Row], list[str]]:
            own: list[str] = []
            return part(own), own

        with ThreadPoolExecutor(max_workers=2 if args.quick else 1) as pool:
            done = list(pool.map(run_part, (imports_part, lifecycle_part)))
        for got, own in done:
            rows.extend(got)
            notes.extend(own)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    rows = held(rows, args.quick)
    print(json.dumps([r.as_dict() for r in rows]))
    print_table(rows)
    print()
    print("notes:")
    for note in notes:
        print("- " + note)
    print(f"- wall time {time.monotonic() - started:.1f} s")
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
