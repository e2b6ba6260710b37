"""The settings of the phases: the proofs, the parameters' fetch, the bench and the run phase."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.settings.declare import DAY_S, HOUR_S, setting


@dataclass(frozen=True)
class PhaseFields:
    # --- proving ------------------------------------------------------------------------------
    c1_file: Path = setting(
        Path("/data/zk/c1.json"), "C1 input used for warmup, settle and bench proofs",
        group="proving",
    )  # fmt: skip
    submit_deadline_s: float = setting(
        60.0, "deadline of one SubmitProof call (uploads ~51 MB)", minimum=0.1, maximum=DAY_S,
        group="proving",
    )  # fmt: skip
    await_deadline_s: float = setting(
        30.0, "deadline of one AwaitProof call (awaited again when cut)", minimum=0.1,
        maximum=DAY_S, group="proving",
    )  # fmt: skip
    warmup_budget_s: float = setting(
        3600.0, "total time for the warmup proof (no PCE cache yet)", minimum=1, maximum=DAY_S,
        group="proving",
    )  # fmt: skip
    proof_budget_s: float = setting(
        1800.0, "total time for any other proof", minimum=1, maximum=DAY_S, group="proving"
    )

    # --- parameters ---------------------------------------------------------------------------
    params_fetch_command: str = setting(
        "", "shell command that downloads the proof parameters; empty: none",
        form="command", group="params",
    )  # fmt: skip
    params_expected: tuple[str, ...] = setting(
        (), "expected parameter files as NAME:BYTES (a file name in daemon_param_cache, at most "
        "1 TiB); all present: fetch skipped",
        form="expected_file", group="params", metavar="NAME:BYTES...",
    )  # fmt: skip
    params_progress_interval_s: float = setting(
        10.0, "cadence of parameter download progress lines", minimum=0.1, maximum=HOUR_S,
        group="params",
    )  # fmt: skip
    params_timeout_s: float = setting(
        5400.0, "longest the fetch command may run (the manager kills at 90 min in registered)",
        minimum=1, maximum=DAY_S, group="params",
    )  # fmt: skip
    params_lock_wait_s: float = setting(
        900.0, "longest the params phase waits for a running supervisor's fetch into the same "
        "folder to release the params lock (a dead one's is stopped at once); then exit 8",
        minimum=0, maximum=DAY_S, group="params",
    )  # fmt: skip

    # --- bench --------------------------------------------------------------------------------
    bench_count: int = setting(
        12, "proofs in the benchmark batch", minimum=1, maximum=10_000, group="bench"
    )
    bench_concurrency: int = setting(
        2, "benchmark proofs in flight", minimum=1, maximum=256, group="bench"
    )
    bench_queue_ahead: int = setting(
        2, "benchmark proofs kept submitted beyond bench_concurrency, queued in the daemon so the "
        "next is there when one ends (our late answer or reconnect never leaves it idle); the "
        "daemon starts partitions by its workers, not by jobs queued: each costs only its input",
        minimum=0, maximum=64, group="bench",
    )  # fmt: skip
    bench_budget_s: float = setting(
        2700.0, "the manager's benchmark budget (its 45 min timeout)", minimum=1, maximum=DAY_S,
        group="bench",
    )  # fmt: skip
    bench_min_proofs: int = setting(
        3, "completions a measurement needs; a bench interrupted with less reports a short rate",
        minimum=2, maximum=1000, group="bench",
    )  # fmt: skip
    bench_safety: float = setting(
        1.25, "estimated times are stretched by this before they are held against the budget",
        minimum=1, maximum=10, group="bench", metavar="FACTOR",
    )  # fmt: skip
    bench_precision: float = setting(
        0.01, "adaptive stop: the rate reported must be known within this fraction (its 95 % "
        "interval, from batch means of its completions): the batch ends early once it is, its "
        "verdict against min_rate certain, after bench_min_soak_s on a machine that holds still, "
        "never before bench_min_proofs (and 5) completions; it goes on past bench_count, up to "
        "bench_max_proofs, while it is not; 0 = off: the whole bench_count batch",
        minimum=0, maximum=0.5, group="bench", metavar="FRACTION",
    )  # fmt: skip
    bench_min_soak_s: float = setting(
        600.0, "adaptive stop: daemon seconds from the batch's start before it may end early (a "
        "GPU reaching its power cap, a CPU warming into its throttle, slow down after minutes)",
        minimum=0, maximum=DAY_S, group="bench",
    )  # fmt: skip
    bench_max_proofs: int = setting(
        36, "adaptive stop: most proofs the batch goes on to, past bench_count, while the rate it "
        "would report is not known within bench_precision (99 %) or too close to min_rate to tell "
        "(the budget still bounds it; never fewer than bench_count)",
        minimum=1, maximum=10_000, group="bench",
    )  # fmt: skip
    bench_status_sample_s: float = setting(
        0.5, "seconds between samples of the daemon's HTTP status while the bench measures (what "
        "bounds the rate: bench.result's bound); 0 = off", minimum=0, maximum=60, group="bench",
    )  # fmt: skip
    restart_after_warmup: bool = setting(
        True,
        "restart at full workers after the warmup (off for the budget release: it loses the PCE)",
        group="bench",
    )
    rate_time_scale: float = setting(
        1.0, "daemon seconds per wall second: rates are reported in the daemon's clock (the "
        "simulator's --time-scale; 1 on real hardware)",
        minimum=0.001, maximum=1_000_000, group="bench",
    )  # fmt: skip

    # --- run phase ----------------------------------------------------------------------------
    worker_commands: tuple[str, ...] = setting(
        (), "shell commands supervised beside the daemon in the run phase", form="command",
        group="run", metavar="COMMANDS",
    )  # fmt: skip
    exit_after_run: bool = setting(
        False, "exit once the run phase is reached (demos and tests)", group="run"
    )
    # The run phase's health watch (docs/run-phase.md; core.health, core.healthladder).
    health_interval_s: float = setting(
        30.0, "how often the run phase's health is judged; 0: not watched", minimum=0,
        maximum=HOUR_S, group="run",
    )  # fmt: skip
    health_ladder: str = setting(
        "tell", "the last step the health watch may take: say, restart (the daemon) or tell "
        "(the manager, which ends a broken machine)", choices=("say", "restart", "tell"),
        group="run", metavar="STEP",
    )  # fmt: skip
    health_gpu_lost_s: float = setting(
        60.0, "a GPU NVML cannot read for this long is lost (XID 79: at once)", minimum=0,
        maximum=DAY_S, group="run",
    )  # fmt: skip
    health_failing_proofs: int = setting(
        3, "failed proofs in a row, none completed, that make proofs failing; 0: not judged",
        minimum=0, maximum=10_000, group="run",
    )  # fmt: skip
    health_failing_s: float = setting(
        900.0, "proofs failing this long is broken (the daemon is restarted once first)",
        minimum=0, maximum=7 * DAY_S, group="run",
    )  # fmt: skip
    health_stuck_factor: float = setting(
        10.0, "a partition in the GPU stage this many times its measured time is stuck",
        minimum=1, maximum=10_000, group="run",
    )  # fmt: skip
    health_stuck_min_s: float = setting(
        120.0, "a stuck partition's least time in the GPU stage (and the threshold while none "
        "was measured)", minimum=0, maximum=DAY_S, group="run",
    )  # fmt: skip
    health_throttle_ratio: float = setting(
        0.5, "a loaded GPU whose SM clock is at most this share of its maximum, held down by a "
        "slowdown reason, is throttled", minimum=0, maximum=1, group="run",
    )  # fmt: skip
    health_throttle_s: float = setting(
        3600.0, "throttled this long is degraded", minimum=0, maximum=7 * DAY_S, group="run"
    )
    health_daemon_exits: int = setting(
        3, "daemon exits within health_exit_window_s that are degraded; 0: not judged",
        minimum=0, maximum=10_000, group="run",
    )  # fmt: skip
    health_exit_window_s: float = setting(
        HOUR_S, "the window health_daemon_exits counts in", minimum=1, maximum=7 * DAY_S,
        group="run",
    )  # fmt: skip
    health_restart_limit: int = setting(
        3, "daemon restarts the health watch may make within health_restart_window_s",
        minimum=0, maximum=1000, group="run",
    )  # fmt: skip
    health_restart_window_s: float = setting(
        DAY_S, "the window health_restart_limit counts in", minimum=1, maximum=30 * DAY_S,
        group="run",
    )  # fmt: skip
