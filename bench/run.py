"""The supervisor's figures against the simulator: real processes on loopback, one table.

    .venv/bin/python bench/run.py [--json FILE] [--quick] [--only NAME ...] [--time-scale S]
                                  [--run-window-s S]

Figures (``--only`` names): run_phase (the supervisor in the run phase: RSS, PSS, USS, idle CPU,
where its RSS lies and what its imports cost; in a full run also its RSS after proofs of a
field-size C1, 51 MB), crash
(SIGKILL -> daemon.exited), readiness (sim serving -> daemon.ready), stop (SIGTERM -> exit),
rate (bench.result against the sim's model), overhead (lifecycle wall minus the sim's own work),
log_throughput (a flooding daemon's lines carried to cuzk.log, none lost), oom (delegated to
bench/oom_reaction.py when it exists), frozen_recovery (result seen after a frozen connection,
delegated to bench/frozen_recovery.py). Progress goes to stderr; the table, then notes (the
definitions and raw samples behind the figures), to stdout. ``--json FILE`` writes the rows as
a list of {"name", "value", "unit", "target", "ok"}. ``--quick`` measures every figure once, in
seconds (one lifecycle, a second if the first fails, short windows, the sim at time scale 1000
and its memory at an eighth, the delegated scripts ``--quick`` too, the stages side by side): a
check that nothing stopped measuring, not figures to hold against the targets. Exit 0 when every
row holds a figure and meets its target, 1 when one is NOT MEASURED, 3 when a target is missed (a
quick run holds only the targets of what must never happen: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _daemon
import _lifecycle
import _settings as cfg
from _harness import (
    PY,
    QUICK_TIME_SCALE,
    BenchError,
    Processes,
    Row,
    compile_package,
    failed,
    finish,
    held,
    print_table,
    progress_printer,
    standard_options,
    within,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
NAMES = (
    "run_phase", "crash", "readiness", "stop", "rate", "overhead", "log_throughput", "oom",
    "frozen_recovery",
)  # fmt: skip
OOM_SCRIPT = BENCH_DIR / "oom_reaction.py"
FROZEN_SCRIPT = BENCH_DIR / "frozen_recovery.py"
DELEGATED_TIMEOUT_S = 300


progress = progress_printer("bench")


def _json_rows(text: str) -> list[dict[str, Any]] | None:
    """The rows a delegated script wrote with ``--json FILE`` (a JSON list of rows)."""
    try:
        loaded = json.loads(text)
    except ValueError:
        return None
    rows = loaded if isinstance(loaded, list) else []
    if rows and all(isinstance(r, dict) and "name" in r for r in rows):
        return rows
    return None


def delegated_rows(
    script: Path, prefix: str, label: str, quick: bool, workdir: Path, notes: list[str]
) -> list[Row]:
    """Run a bench script of its own (``--json FILE``, ``--quick`` in a quick run) and take the
    rows it writes, each name under ``prefix``."""
    if not script.exists():
        return [failed(label, "", "", f"bench/{script.name} missing")]
    out = workdir / f"{script.stem}.json"
    argv = [PY, str(script), "--json", str(out), *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=DELEGATED_TIMEOUT_S, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return [failed(label, "", "", f"timed out after {DELEGATED_TIMEOUT_S} s")]
    loaded = _json_rows(out.read_text()) if out.exists() else None
    if loaded is None:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return [failed(label, "", "", f"rc {done.returncode}, no rows: {tail}")]
    notes.append(f"{label}: `{' '.join(argv[1:])}` (rc {done.returncode}), its rows as given")
    return [
        Row(f"{prefix}: {r['name']}", r.get("value"), str(r.get("unit", "")),
            str(r.get("target", "")), r.get("ok"))
        for r in loaded
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    standard_options(
        parser,
        f"1 lifecycle, 1 kill (none in the long start), short windows, time scale "
        f"{QUICK_TIME_SCALE:g}, the delegated scripts --quick, the stages side by side",
    )
    parser.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME", help=", ".join(NAMES))
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="the sim's simulated seconds per real second (default 100, as `sim`; "
        f"{QUICK_TIME_SCALE:g} with --quick)",
    )
    parser.add_argument(
        "--run-window-s",
        type=within(1, 3600),
        default=60.0,
        help="the run phase's measured window in seconds (default 60; 1 with --quick): the idle"
        " CPU is counted in 10 ms ticks, 6 of them in 60 s at the 0.1 %% target, so a longer"
        " window gives a finer figure",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    wanted = set(args.only or NAMES)
    quick = args.quick
    scale = args.time_scale or (QUICK_TIME_SCALE if quick else 100.0)
    memory_scale = cfg.QUICK_MEMORY_SCALE if quick else 1.0
    compile_package()  # as the image's pip install does (see _harness.compile_package)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="cuzk-bench-"))
    procs = Processes(str(root))
    rows: list[Row] = []
    notes: list[str] = [f"time scale {scale:g}; {'quick' if quick else 'full'} run; tmp {root}"]

    # (label, work): each stage writes its notes to a list of its own (stages may run at once).
    stages: list[tuple[str, Callable[[list[str]], list[Row]]]] = []
    life = wanted & {"run_phase", "stop", "rate", "overhead"}
    if life:
        runs = (1 if quick else 5) if life - {"run_phase"} else 1
        hold = (1.0 if quick else args.run_window_s) if "run_phase" in life else 0.0
        stages.append((
            f"lifecycles ({runs} x `supervisor run`, run-phase window {hold:g} s)",
            lambda own: _lifecycle.measure(
                procs,
                root / "life",
                scale,
                runs,
                hold,
                life,
                own,
                spare=1 if quick else 0,
                memory_scale=memory_scale,
                field_c1_hold_s=0.0 if quick else 5.0,
            ),
        ))  # fmt: skip
    if wanted & {"crash", "readiness"}:
        kills = 1 if quick else 20
        stages.append((
            f"crash detection and readiness ({kills} kills, `supervisor daemon`)",
            lambda own: _daemon.crash_and_readiness(
                procs, root / "crash", scale, kills, wanted, own, memory_scale
            ),
        ))  # fmt: skip
    if "readiness" in wanted:
        # A start ten times longer than the one above (time scale 10 in a full run).
        long_scale = scale / 10
        long_kills = 0 if quick else _daemon.LONG_START_KILLS
        stages.append((
            f"readiness after a long start (time scale {long_scale:g})",
            lambda own: _daemon.readiness_long_start(
                procs, root / "long", long_scale, long_kills, own, memory_scale
            ),
        ))  # fmt: skip
    if "log_throughput" in wanted:
        # Then a probe at a higher rate: the first figure is capped by what is offered. One
        # after the other: each flood wants a core.
        window, probe_window = (0.5, 0.5) if quick else (5.0, 3.0)
        stages.append((
            f"log throughput (flood:{_daemon.FLOOD_OFFERED}, {window:g} s window; probe "
            f"flood:{_daemon.FLOOD_PROBE}, {probe_window:g} s)",
            lambda own: [
                *_daemon.log_throughput(procs, root / "flood", scale, window, own),
                *_daemon.log_throughput_probe(procs, root / "probe", scale, probe_window, own),
            ],
        ))  # fmt: skip
    if "oom" in wanted:
        stages.append((
            "OOM reaction (bench/oom_reaction.py)",
            lambda own: delegated_rows(OOM_SCRIPT, "oom", "OOM reaction", quick, root, own),
        ))  # fmt: skip
    if "frozen_recovery" in wanted:
        stages.append((
            "recovery after a frozen connection (bench/frozen_recovery.py)",
            lambda own: delegated_rows(
                FROZEN_SCRIPT, "frozen", "frozen recovery", quick, root, own
            ),
        ))  # fmt: skip

    def stage(label: str, work: Callable[[list[str]], list[Row]]) -> tuple[list[Row], list[str]]:
        progress(f"{label} ...")
        t0 = time.monotonic()
        own: list[str] = []
        try:
            got = work(own)
        except BenchError as exc:  # a stage that cannot finish still leaves a row
            got = [failed(label, "", "", str(exc))]
        progress(f"{label} done in {time.monotonic() - t0:.1f} s")
        return got, own

    try:
        # A quick run runs the stages side by side (each mostly waits on the sim's scaled time):
        # its figures show that each is still measured, they are not for the targets.
        with ThreadPoolExecutor(max_workers=max(1, len(stages)) if quick else 1) as pool:
            done = list(pool.map(lambda item: stage(*item), stages))
        for got, own in done:
            rows.extend(got)
            notes.extend(own)
    finally:
        procs.close()
        if procs.leftovers:
            notes.append("LEFT BEHIND (killed by the bench): " + "; ".join(procs.leftovers))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    rows = held(rows, quick)
    print_table(rows)
    print()
    print("notes:")
    for note in notes:
        print("- " + note.replace("\n", "\n  "))
    print(f"- wall time {time.monotonic() - started:.1f} s")
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
