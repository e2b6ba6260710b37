"""Figures from whole lifecycles: ``supervisor run`` against the sim manager and sim daemon.

Each run goes register → … → run, is held in the run phase (the first one for the RSS/CPU
window), then stopped with SIGTERM. One run gives a stop-latency sample, a measured rate and an
overhead figure; the first also the run phase's memory (RSS, PSS, USS, and where its RSS lies:
``_memory``) and idle CPU. That first one runs under ``tests/loadedmodules.py``, which writes
the modules it loaded at its exit (for the imports by package; the launcher adds ``runpy`` and
``atexit``, nothing else).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import _runphase
import _settings as cfg
from _harness import (
    PY,
    BenchError,
    DaemonLine,
    Manager,
    Processes,
    Row,
    SupervisorProc,
    at_most,
    event_ts,
    failed,
    info,
    median,
    read_daemon_log,
)

from cuzk_supervisor.sim.daemon import model, pipeline
from cuzk_supervisor.sim.daemon.c1 import write_c1

MIB = 1 << 20
LAUNCHER = Path(__file__).resolve().parent.parent / "tests" / "loadedmodules.py"
FIELD_C1_BYTES = 51_000_000
"""A 32 GiB sector's C1 output, as the field's proofs send it (docs/daemon.md)."""
STARTING = "cuzk-daemon starting"
SERVING = "cuzk-daemon ready, serving on"
SUBMITTED_RE = re.compile(r"proof submitted job_id=(\S+)")
COMPLETED_RE = re.compile(r"proof completed job_id=(\S+).* total_ms=(\d+)")
PHASES = ("register", "params", "plan", "warmup", "restart", "settle", "bench", "report", "run")

STOP_TARGET_S = 2.0
RATE_TARGET_PCT = 1.0
OVERHEAD_TARGET_PCT = 2.0

OVERHEAD_DEFINITION = """\
orchestration overhead = (W - B - I) / W, from one `supervisor run` per lifecycle:
  W  lifecycle wall: the supervisor's spawn (time.time() before Popen) to its `phase.entered
     run` event (its own timestamp);
  B  the sim's own work: the union of the intervals in which the sim daemon was busy, from its
     own lines in log_dir/cuzk.log: each start ("cuzk-daemon starting" -> "ready, serving on":
     engine start, SRS and PCE loads) and each proof (its "proof completed" line minus
     total_ms / time_scale: the job's own clock, from its call's arrival). This is warmup,
     restart start-up, settle and the whole bench batch; proofs overlap in the batch, so a
     union, not a sum;
  I  the sim's Python interpreter start (`daemon.spawned` -> "cuzk-daemon starting"): excluded
     as a simulator artefact (the real daemon is a Rust binary); shown apart.
Everything else is the supervisor's: its own start, register/params/plan, spawning, readiness
polling, stopping the warmup daemon, submit/await round trips and gaps, report, /running."""


@dataclass
class LifeRun:
    index: int
    wall_s: float = 0.0
    busy_s: float = 0.0
    interp_s: float = 0.0
    ready_gap_s: float = 0.0
    ready_gaps: list[float] = field(default_factory=list)
    ready_calls: list[int] = field(default_factory=list)
    stop_s: float = 0.0
    stop_rc: int = 0
    rate: float = 0.0
    count: int = 0
    concurrency: int = 0
    completed: int = 0
    bench_wall_s: float = 0.0
    run_phase: _runphase.RunPhase | None = None  # the first one's window
    per_phase: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.busy_s - self.interp_s


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def busy_intervals(lines: list[DaemonLine], time_scale: float) -> list[tuple[float, float]]:
    """When the sim had work in progress: each start-up and each proof (see the definition)."""
    spans: list[tuple[float, float]] = []
    starting: float | None = None
    submitted: dict[str, float] = {}
    for line in lines:
        if STARTING in line.text:
            starting = line.ts
        elif SERVING in line.text and starting is not None:
            spans.append((starting, line.ts))
            starting = None
        elif (found := SUBMITTED_RE.search(line.text)) is not None:
            submitted[found.group(1)] = line.ts
        elif (found := COMPLETED_RE.search(line.text)) is not None:
            # The job's own clock, or its "submitted" line if that is earlier (the sim's timers
            # run a little late: that lateness is the sim's, not the supervisor's).
            begin = line.ts - int(found.group(2)) / 1000 / time_scale
            spans.append((min(begin, submitted.get(found.group(1), begin)), line.ts))
    return spans


def _analyse(sup: SupervisorProc, log_dir: Path, time_scale: float, run: LifeRun) -> None:
    entered = {e["phase"]: event_ts(e) for e in sup.named("phase.entered")}
    run_at = entered["run"]
    run.wall_s = run_at - sup.started_wall
    lines = read_daemon_log(log_dir)
    spans = _clip(busy_intervals(lines, time_scale), sup.started_wall, run_at)
    run.busy_s = _union(spans)
    starts = [ln.ts for ln in lines if STARTING in ln.text]
    interp = []
    for spawned in sup.named("daemon.spawned"):
        at = event_ts(spawned)
        later = [ts for ts in starts if ts >= at - 0.05]
        if later:
            interp.append((at, min(later)))
    run.interp_s = _union(_clip(interp, sup.started_wall, run_at))
    serving = [ln.ts for ln in lines if SERVING in ln.text]
    readies = [event_ts(e) for e in sup.named("daemon.ready") if "pid" in e]
    run.ready_gaps = [r - s for r, s in zip(readies, serving, strict=False)]
    run.ready_gap_s = sum(run.ready_gaps)
    run.ready_calls = [int(e["calls"]) for e in sup.named("daemon.ready") if "calls" in e]
    # Per phase: (wall, overhead) with the same definition, for the analysis.
    phases = sorted(((p, t) for p, t in entered.items() if p != "run"), key=lambda pt: pt[1])
    bounds = [("start", sup.started_wall), *phases, ("run", run_at)]
    for (phase, lo), (_, hi) in itertools.pairwise(bounds):
        wall = hi - lo
        busy = _union(_clip(spans, lo, hi)) + _union(_clip(interp, lo, hi))
        run.per_phase[phase] = (wall, wall - busy)
    # The batch is sized while it runs (``core.bench.next_submission``): ``bench.started`` gives
    # the concurrency and the most proofs allowed, each ``bench.stretch_done`` what was submitted.
    result = sup.named("bench.result")
    started = sup.named("bench.started")
    stretches = sup.named("bench.stretch_done")
    missing = [
        name
        for name, seen in (
            ("bench.result", result),
            ("bench.started", started),
            ("bench.stretch_done", stretches),
        )
        if not seen
    ]
    if missing:
        raise BenchError(f"no {' / '.join(missing)} event")
    run.rate = float(result[0]["rate"])
    run.completed = int(result[0]["completed"])
    run.bench_wall_s = float(result[0]["wall_s"])
    run.count = sum(int(s["submitted"]) for s in stretches)
    run.concurrency = int(started[0]["concurrency"])


def one_lifecycle(
    procs: Processes,
    root: Path,
    manager: Manager,
    time_scale: float,
    hold_s: float,
    index: int,
    memory_scale: float = 1.0,
    c1_bytes: int | None = None,
) -> LifeRun:
    run = LifeRun(index)
    root.mkdir(parents=True, exist_ok=True)
    if c1_bytes is not None:
        write_c1(root / "c1.json", size_bytes=c1_bytes)
    env = cfg.lifecycle(root, manager.url, time_scale, memory_scale)
    listing = root / "modules.txt"
    wrapper = (PY, str(LAUNCHER), str(listing)) if hold_s > 0 else ()
    sup = SupervisorProc(procs, "run", env, wrapper=wrapper)
    sup.wait_event("phase.entered", 300, phase="run")
    for spawned in sup.named("daemon.spawned"):
        procs.note(int(spawned["pid"]))
    if hold_s > 0:
        # From the health watch's start: the run phase has begun, its memory given back.
        sup.wait_event("health.watching", 60)
        run.run_phase = _runphase.sample(sup.pid, hold_s)
    run.stop_s, run.stop_rc = sup.stop()
    sup.dump(root / "events.jsonl")
    if run.run_phase is not None and listing.exists():
        run.run_phase.modules = listing.read_text().split()
    _analyse(sup, root / "log", time_scale, run)
    return run


def measure(
    procs: Processes,
    root: Path,
    time_scale: float,
    runs: int,
    hold_s: float,
    wanted: set[str],
    notes: list[str],
    spare: int = 0,
    memory_scale: float = 1.0,
    field_c1_hold_s: float = 0.0,
) -> list[Row]:
    """``runs`` lifecycles, and up to ``spare`` more while none could be measured (a quick run,
    on a loaded machine); the first that gets through holds the run-phase window.
    ``memory_scale``: the sim's real MiB per simulated GiB (``_settings.common``).
    ``field_c1_hold_s``: one more, whose proofs send a field-size C1, held this long."""
    root.mkdir(parents=True, exist_ok=True)
    manager = Manager(procs, root / "manager.db")
    done: list[LifeRun] = []
    problems: list[str] = []
    try:
        i = 0
        while i < runs or (not done and i < runs + spare):
            hold = 0.0 if done else hold_s
            try:
                life = root / f"life{i}"
                done.append(one_lifecycle(procs, life, manager, time_scale, hold, i, memory_scale))
            except BenchError as exc:
                problems.append(f"lifecycle {i}: {exc}")
            i += 1
        field_c1 = None
        if field_c1_hold_s > 0 and "run_phase" in wanted:
            try:
                field_c1 = one_lifecycle(
                    procs,
                    root / "field-c1",
                    manager,
                    time_scale,
                    field_c1_hold_s,
                    i,
                    memory_scale,
                    FIELD_C1_BYTES,
                )
            except BenchError as exc:
                problems.append(f"lifecycle with a field-size C1: {exc}")
    finally:
        manager.stop()
    notes.extend(problems)
    why = "; ".join(problems) or "no run"
    rows: list[Row] = []
    if "run_phase" in wanted:
        first = done[0].run_phase if done and hold_s > 0 else None
        other = field_c1.run_phase if field_c1 is not None else None
        rows += _runphase.rows(first, other, notes, why)
    return rows + _rows(done, time_scale, wanted, notes, why)


def _rows(
    done: list[LifeRun], time_scale: float, wanted: set[str], notes: list[str], why: str
) -> list[Row]:
    rows: list[Row] = []
    if "stop" in wanted:
        if not done:
            rows.append(failed("stop latency (SIGTERM -> exit), median", "s", "<= 2", why))
        else:
            stops = [r.stop_s for r in done]
            rows.append(
                at_most(
                    f"stop latency (SIGTERM -> exit), median of {len(stops)}",
                    median(stops),
                    "s",
                    STOP_TARGET_S,
                )
            )
            rows.append(info("stop latency, max", max(stops), "s"))
            notes.append(
                "stop: `supervisor run` in the run phase, cooperative daemon (the sim dies at once "
                f"on SIGTERM); samples {', '.join(f'{s:.3f}' for s in stops)} s; exit codes "
                f"{sorted({r.stop_rc for r in done})}"
            )
    if "rate" in wanted:
        rows.extend(_rate_rows(done, notes, why))
    if "overhead" in wanted:
        rows.extend(_overhead_rows(done, time_scale, notes, why))
    return rows


def _rate_rows(done: list[LifeRun], notes: list[str], why: str) -> list[Row]:
    name = f"rate error vs steady state (W={cfg.WORKERS}, {cfg.BENCH_COUNT} proofs, C=2), median"
    if not done:
        return [failed(name, "%", f"<= {RATE_TARGET_PCT:g} abs", why)]
    steady = model.steady_state_proofs_per_hour(cfg.WORKERS, cfg.BENCH_CONCURRENCY, cfg.GPU_WORKERS)
    batch = pipeline.batch_proofs_per_hour(
        cfg.WORKERS, cfg.GPU_WORKERS, cfg.BENCH_CONCURRENCY, cfg.BENCH_COUNT
    )
    errors, batch_errors = [], []
    for r in done:
        if (r.count, r.concurrency) != (cfg.BENCH_COUNT, cfg.BENCH_CONCURRENCY):
            notes.append(f"lifecycle {r.index}: bench sized to {r.count} at C={r.concurrency}")
        errors.append(100 * (r.rate / steady - 1))
        batch_errors.append(100 * (r.rate / batch - 1))
    err = median(errors)
    rows = [
        Row(name, err, "%", f"<= {RATE_TARGET_PCT:g} abs", abs(err) <= RATE_TARGET_PCT),
        info("rate error vs steady state, worst", max(errors, key=abs), "%"),
        info("rate error vs finite-batch model, median", median(batch_errors), "%"),
        info("model's own finite-batch error (batch vs steady)", 100 * (batch / steady - 1), "%"),
        info("measured rate, median", median([r.rate for r in done]), "proofs/h"),
    ]
    notes.append(
        f"rate: bench.result rates {', '.join(f'{r.rate:.3f}' for r in done)} proofs/h (daemon "
        f"clock); steady state {steady:.3f}, finite batch of {cfg.BENCH_COUNT} {batch:.3f}; "
        f"bench wall {', '.join(f'{r.bench_wall_s:.2f}' for r in done)} s; C1 input "
        f"{cfg.C1_BYTES // 1000} kB (the field's is ~51 MB: serialising it would add client time)"
    )
    return rows


def _overhead_rows(done: list[LifeRun], time_scale: float, notes: list[str], why: str) -> list[Row]:
    name = "orchestration overhead share of lifecycle wall, median"
    if not done:
        return [failed(name, "%", f"<= {OVERHEAD_TARGET_PCT:g}", why)]
    shares = [100 * r.overhead_s / r.wall_s for r in done]
    # The same seconds of overhead against the sim's work at its real length (time scale 1).
    projected = [
        100 * r.overhead_s / (r.overhead_s + r.busy_s * time_scale + r.interp_s) for r in done
    ]
    mid = sorted(done, key=lambda r: r.overhead_s)[len(done) // 2]
    rows = [
        at_most(name, median(shares), "%", OVERHEAD_TARGET_PCT),
        info("orchestration overhead, median", median([r.overhead_s for r in done]), "s"),
        info("lifecycle wall (spawn -> run phase), median", median([r.wall_s for r in done]), "s"),
        info("sim's own work in it, median", median([r.busy_s for r in done]), "s"),
        info("sim interpreter start (excluded), median", median([r.interp_s for r in done]), "s"),
        info(
            "  of the overhead: the supervisor's start (spawn -> register: interpreter, imports,"
            " checks, state, servers), median",
            median([r.per_phase.get("start", (0.0, 0.0))[1] for r in done]),
            "s",
        ),
        info(
            "  of the overhead: readiness polling (serving -> daemon.ready), median",
            median([r.ready_gap_s for r in done]),
            "s",
        ),
        *(
            info(
                f"  readiness gap of the {label} start (serving -> daemon.ready), median",
                median([1000 * r.ready_gaps[i] for r in done if len(r.ready_gaps) > i]),
                "ms",
            )
            for i, label in enumerate(("warmup", "restart"))
            if any(len(r.ready_gaps) > i for r in done)
        ),
        info(
            f"overhead share projected to time scale 1 (x{time_scale:g} sim work)",
            median(projected),
            "%",
        ),
    ]
    notes.append(OVERHEAD_DEFINITION)
    notes.append(
        "readiness gaps inside the lifecycles (ms, warmup/restart start; GetStatus calls): "
        + ", ".join(
            "/".join(f"{1000 * g:.0f}" for g in r.ready_gaps) + f" ({r.ready_calls})" for r in done
        )
    )
    breakdown = ", ".join(
        f"{phase} {wall:.2f}/{over:.2f}" for phase, (wall, over) in mid.per_phase.items()
    )
    notes.append(
        f"overhead by phase, lifecycle {mid.index} (phase wall s / overhead s; 'start' = spawn to "
        f"register): {breakdown}"
    )
    return rows
