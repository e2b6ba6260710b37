"""The supervisor's figures against the simulator: real processes on loopback, one table.

    .venv/bin/python bench/run.py [--json FILE] [--quick] [--only NAME ...] [--time-scale S]

Figures (``--only`` names): run_phase (supervisor RSS and CPU in the run phase), crash
(SIGKILL -> daemon.exited), readiness (sim serving -> daemon.ready), stop (SIGTERM -> exit),
rate (bench.result against the sim's model), overhead (lifecycle wall minus the sim's own work),
log_throughput (a flooding daemon's lines carried to cuzk.log, none lost), oom (delegated to
bench/oom_reaction.py when it exists), frozen_recovery (result seen after a frozen connection,
delegated to bench/frozen_recovery.py). Progress goes to stderr; the table, then notes (the
definitions and raw samples behind the figures), to stdout. ``--json FILE`` writes the rows as
a list of {"name", "value", "unit", "target", "ok"}.
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
from pathlib import Path
from typing import Any

import _daemon
import _lifecycle
from _harness import PY, BenchError, Processes, Row, failed, print_table

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
NAMES = (
    "run_phase", "crash", "readiness", "stop", "rate", "overhead", "log_throughput", "oom",
    "frozen_recovery",
)  # fmt: skip
OOM_SCRIPT = BENCH_DIR / "oom_reaction.py"
OOM_TIMEOUT_S = 300
OOM_QUICK_RUNS = 2
FROZEN_SCRIPT = BENCH_DIR / "frozen_recovery.py"
FROZEN_TIMEOUT_S = 300


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _flags(script: Path) -> str:
    """The script's ``--help`` text (to pass only the options it takes)."""
    try:
        done = subprocess.run(
            [PY, str(script), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout


def _json_rows(text: str) -> list[dict[str, Any]] | None:
    """The first line of ``text`` that is a JSON list of rows."""
    for line in text.splitlines():
        if line.startswith("["):
            try:
                loaded = json.loads(line)
            except ValueError:
                continue
            rows = loaded if isinstance(loaded, list) else []
            if rows and all(isinstance(r, dict) and "name" in r for r in rows):
                return rows
    return None


def oom_rows(quick: bool, workdir: Path, notes: list[str]) -> list[Row]:
    """Run ``bench/oom_reaction.py`` (its own process) and take its rows: from ``--json FILE``
    if it takes that option, else from the JSON list it prints; ``--quick`` (or ``--runs 2``)
    in a quick run, when it takes one."""
    if not OOM_SCRIPT.exists():
        return [Row("OOM reaction [bench/oom_reaction.py missing: not measured]", None, "")]
    flags = _flags(OOM_SCRIPT)
    out = workdir / "oom.json"
    argv = [PY, str(OOM_SCRIPT)]
    if "--json" in flags:
        argv += ["--json", str(out)]
    if quick and "--quick" in flags:
        argv.append("--quick")
    elif quick and "--runs" in flags:
        argv += ["--runs", str(OOM_QUICK_RUNS)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=OOM_TIMEOUT_S, cwd=REPO)
    except subprocess.TimeoutExpired:
        return [failed("OOM reaction", "", "", f"timed out after {OOM_TIMEOUT_S} s")]
    loaded = _json_rows(out.read_text()) if out.exists() else _json_rows(done.stdout)
    if loaded is None:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return [failed("OOM reaction", "", "", f"rc {done.returncode}, no rows: {tail}")]
    notes.append(f"OOM reaction: `{' '.join(argv[1:])}` (rc {done.returncode}), its rows as given")
    return [
        Row(f"oom: {r['name']}", r.get("value"), str(r.get("unit", "")),
            str(r.get("target", "")), r.get("ok"))
        for r in loaded
    ]  # fmt: skip


def frozen_rows(quick: bool, workdir: Path, notes: list[str]) -> list[Row]:
    """Run ``bench/frozen_recovery.py`` (its own process) and take the rows it writes."""
    out = workdir / "frozen.json"
    argv = [PY, str(FROZEN_SCRIPT), "--json", str(out), *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=FROZEN_TIMEOUT_S, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return [failed("frozen recovery", "s", "", f"timed out after {FROZEN_TIMEOUT_S} s")]
    loaded = _json_rows(out.read_text()) if out.exists() else None
    if loaded is None:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return [failed("frozen recovery", "s", "", f"rc {done.returncode}, no rows: {tail}")]
    notes.append(f"frozen recovery: `{' '.join(argv[1:])}` (rc {done.returncode}), its rows")
    return [
        Row(f"frozen: {r['name']}", r.get("value"), str(r.get("unit", "")),
            str(r.get("target", "")), r.get("ok"))
        for r in loaded
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer samples")
    parser.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME", help=", ".join(NAMES))
    parser.add_argument(
        "--time-scale",
        type=float,
        default=100.0,
        help="the sim's simulated seconds per real second (default 100, as `sim`)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    wanted = set(args.only or NAMES)
    quick = args.quick
    scale = args.time_scale
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="cuzk-bench-"))
    procs = Processes(str(root))
    rows: list[Row] = []
    notes: list[str] = [f"time scale {scale:g}; {'quick' if quick else 'full'} run; tmp {root}"]

    def stage(label: str, work: Callable[[], list[Row]]) -> None:
        progress(f"{label} ...")
        t0 = time.monotonic()
        try:
            rows.extend(work())
        except BenchError as exc:  # a stage that cannot finish still leaves a row
            rows.append(failed(label, "", "", str(exc)))
        progress(f"{label} done in {time.monotonic() - t0:.1f} s")

    try:
        life = wanted & {"run_phase", "stop", "rate", "overhead"}
        if life:
            runs = (3 if quick else 5) if life - {"run_phase"} else 1
            hold = (15.0 if quick else 60.0) if "run_phase" in life else 0.0
            stage(
                f"lifecycles ({runs} x `supervisor run`, run-phase window {hold:g} s)",
                lambda: _lifecycle.measure(procs, root / "life", scale, runs, hold, life, notes),
            )
        if wanted & {"crash", "readiness"}:
            kills = 5 if quick else 20
            stage(
                f"crash detection and readiness ({kills} kills, `supervisor daemon`)",
                lambda: _daemon.crash_and_readiness(
                    procs, root / "crash", scale, kills, wanted, notes
                ),
            )
        if "readiness" in wanted and not quick:
            stage(
                f"readiness after a long start (time scale {_daemon.LONG_START_SCALE:g})",
                lambda: _daemon.readiness_long_start(procs, root / "long", notes),
            )
        if "log_throughput" in wanted:
            window = 3.0 if quick else 5.0
            stage(
                f"log throughput (flood:{_daemon.FLOOD_OFFERED}, {window:g} s window)",
                lambda: _daemon.log_throughput(procs, root / "flood", scale, window, notes),
            )
            if not quick:  # the figure above is capped by what is offered: look for headroom
                stage(
                    f"log throughput probe (flood:{_daemon.FLOOD_PROBE})",
                    lambda: _daemon.log_throughput_probe(procs, root / "probe", scale, notes),
                )
        if "oom" in wanted:
            stage("OOM reaction (bench/oom_reaction.py)", lambda: oom_rows(quick, root, notes))
        if "frozen_recovery" in wanted:
            stage(
                "recovery after a frozen connection (bench/frozen_recovery.py)",
                lambda: frozen_rows(quick, root, notes),
            )
    finally:
        procs.close()
        if procs.leftovers:
            notes.append("LEFT BEHIND (killed by the bench): " + "; ".join(procs.leftovers))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print_table(rows)
    print()
    print("notes:")
    for note in notes:
        print("- " + note.replace("\n", "\n  "))
    print(f"- wall time {time.monotonic() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
