"""``Settings``: every setting of the supervisor, one frozen object, declared group by group.

Each field is declared once (``declare.setting``) with its default, help text, limits and group;
the flags, the environment variables, the TOML keys, the ``config`` dump and the README's table
are derived from these declarations. The checks that span settings are in ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cuzk_supervisor.address import check_public, parse_address
from cuzk_supervisor.core.checks import Comparison, compares
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings.declare import DAY_S, HOUR_S, LOG_LEVELS, redact_url, setting


@dataclass(frozen=True)
class Settings:
    # --- manager ------------------------------------------------------------------------------
    label: str = setting(
        "",
        "instance label sent to /register (letters, digits and . _ : @ + -, at most 128); "
        "empty: VAST_CONTAINERLABEL",
        form="label", max_length=128, group="manager",
    )  # fmt: skip
    min_rate: float = setting(
        0.0,
        "minimum proofs/hour to pass the bench; 0: MIN_RATE, else the manager's default (50)",
        minimum=0, maximum=100_000, group="manager", metavar="RATE",
    )  # fmt: skip
    manager_url: str = setting(
        "",
        "fleet manager base URL (http or https); empty: local run, reports only logged",
        form="url", max_length=2048, group="manager",
    )  # fmt: skip
    manager_token: str = setting(
        "",
        "bearer token sent to the manager, for deployments behind an authenticating proxy",
        secret=True, form="token", group="manager",
    )  # fmt: skip
    manager_connect_timeout_s: float = setting(
        3.0, "connect timeout of one manager request", minimum=0.1, maximum=600, group="manager"
    )
    manager_read_timeout_s: float = setting(
        10.0, "read timeout of one manager request", minimum=0.1, maximum=3600, group="manager"
    )
    manager_retry_s: float = setting(
        120.0,
        "how long one report is retried before it is left in the outbox for later",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_backoff_initial_s: float = setting(
        0.5,
        "first pause before a failed manager request is tried again (full jitter, doubled at "
        "each consecutive failure of any call up to manager_backoff_max_s)",
        minimum=0.01, maximum=600, group="manager",
    )  # fmt: skip
    manager_backoff_max_s: float = setting(
        120.0,
        "longest pause between two tries of a manager request; one backoff per manager, "
        "shared by every call, so a fleet probes a manager that is away at about one request "
        "per machine per half of this, and comes back from an outage spread over it",
        minimum=0.01, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    manager_retry_after_max_s: float = setting(
        600.0,
        "longest Retry-After (on a 429 or 503) honoured; no request goes before it, and a "
        "longer one is cut to this",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_jitter: float = setting(
        0.2,
        "every periodic manager-facing timer (status line, kill look-up, /running ping, log "
        "flush) fires first at a random point of its interval, then varies each interval by "
        "up to this fraction of it either way, so a fleet started together does not stay in step",
        minimum=0, maximum=0.5, group="manager", metavar="FRACTION",
    )  # fmt: skip
    status_interval_s: float = setting(
        60.0,
        "cadence of status lines pushed to the manager in long phases and the run phase",
        minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    running_ping_interval_s: float = setting(
        300.0,
        "cadence of the repeated /running in the run phase, the run phase's kill look-up (it "
        "answers 404 once killed; each one is a line in the manager's own 5,000-line log, "
        "shared by the fleet)",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_status_lookup_s: float = setting(
        0.0,
        "before the run phase, how often the manager's whole table (GET /status) is read to "
        "find a kill from the dashboard; 0: only at a resume and before /bench-done (each read "
        "costs the manager its whole table, about 290 bytes per instance it knows)",
        minimum=0, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_status_read_s: float = setting(
        30.0,
        "how long one read of the manager's whole table is retried (the manager away, or "
        "answering what cannot be its table) before going on without it: before /bench-done "
        "the report is then sent unchecked; for the bench clock, at most 10 s of it",
        minimum=0.1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_status_read_max_rows: int = setting(
        250,
        "the whole table (GET /status) is read before /bench-done, to send no report that "
        "would revive an instance killed from the dashboard, only while the manager's runner "
        "ids (a bound on its rows, about 290 bytes each) are at most this many: past it the "
        "read would cost each machine more as the fleet grows; 0: never",
        minimum=0, maximum=10_000_000, group="manager", metavar="ROWS",
    )  # fmt: skip
    log_push: bool = setting(True, "push log lines to the manager's log endpoint", group="manager")
    log_buffer_lines: int = setting(
        10_000,
        "log lines kept for the manager while it is away (the manager keeps 10,000 per "
        "instance); past this the oldest are dropped, and one line says how many",
        minimum=100, maximum=10_000, group="manager", metavar="LINES",
    )  # fmt: skip
    log_push_interval_s: float = setting(
        120.0,
        "in the run phase, how often the log lines waiting are pushed to the manager (one "
        "push per tab that has lines, 1 push a minute at 120 s; before the run phase: "
        "log_push_early_interval_s)",
        minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    log_push_early_interval_s: float = setting(
        20.0,
        "before the run phase, how often the log lines waiting are pushed to the manager (one "
        "push per tab that has lines, 4 pushes a minute at 20 s; the dashboard shows progress "
        "at least every 30 s with the jitter)",
        minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    log_budget_bytes_per_min: float = setting(
        12_000.0,
        "before the run phase, bytes of log lines pushed to the manager a minute on average, "
        "whatever the fetch and the daemon write: each push sends the newest lines that fit, "
        "and one line counts the older ones left out",
        minimum=500, maximum=500_000, group="manager", metavar="BYTES",
    )  # fmt: skip
    log_run_budget_bytes_per_min: float = setting(
        2_400.0,
        "in the run phase, bytes of log lines pushed to the manager a minute on average, "
        "whatever the daemon writes; as log_budget_bytes_per_min",
        minimum=200, maximum=500_000, group="manager", metavar="BYTES",
    )  # fmt: skip
    manager_weather_s: float = setting(
        600.0,
        "how long the manager's URL may answer with pages that are not the manager's own word "
        "(a proxy's HTML, plain or empty 404, 401, 403, 413, 5xx ...) before one clear warning "
        "says so (setup tab, terminal, /metrics); such answers never end an instance",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip

    # --- logging ------------------------------------------------------------------------------
    log_level: str = setting(
        "info", "supervisor log level", choices=LOG_LEVELS, group="logging", metavar="LEVEL"
    )
    log_format: str = setting(
        "auto",
        "auto: JSON lines on stderr off a terminal; on one, a person's view for run, sim and "
        "prove (run and sim write the JSON lines to log_dir/supervisor.log), colour for the "
        "other commands. console: every event in colour. json: JSON lines everywhere",
        choices=("auto", "json", "console"), group="logging", metavar="FORMAT",
    )  # fmt: skip

    # --- folders ------------------------------------------------------------------------------
    state_dir: Path = setting(
        Path("/var/lib/cuzk-supervisor"), "folder of the durable state file", group="folders"
    )
    run_dir: Path = setting(
        Path("/run/cuzk-supervisor"),
        "folder of the rendered daemon config and its unix socket",
        group="folders",
    )
    log_dir: Path = setting(
        Path("/var/log/cuzk-supervisor"), "folder of the daemon's rotating log", group="folders"
    )

    # --- the daemon ---------------------------------------------------------------------------
    daemon_binary: str = setting(
        "cuzk", "daemon binary (path or name on PATH)", form="program", group="daemon"
    )
    daemon_args: tuple[str, ...] = setting(
        (), "extra arguments put before the daemon's own flags", group="daemon", metavar="ARGS"
    )
    daemon_listen: str = setting(
        "",
        "daemon gRPC address, ip:port or unix:///path; empty: unix socket in run_dir "
        "(loopback only unless allow_public_listen)",
        form="optional_address", group="daemon",
    )  # fmt: skip
    daemon_status_listen: str = setting(
        "127.0.0.1:9821",
        "daemon's HTTP /status address (loopback only unless allow_public_listen)",
        form="address", group="daemon",
    )  # fmt: skip
    allow_public_listen: bool = setting(
        False,
        "allow a daemon_listen or daemon_status_listen that is not loopback or a unix socket "
        "(the daemon has no auth and no TLS: anyone who reaches it can use the GPU)",
        group="daemon",
    )
    daemon_param_cache: Path = setting(
        Path("/data/zk/params"), "parameters and PCE cache folder", group="daemon"
    )
    daemon_base_config: Path | None = setting(
        None, "operator's daemon TOML to merge (our keys win)", group="daemon"
    )
    daemon_log_level: str = setting(
        "info",
        "daemon log level or filter (e.g. info, or cuzk=debug,info)",
        form="log_filter", max_length=512, group="daemon",
    )  # fmt: skip
    daemon_log_max_bytes: int = setting(
        64 * 1024 * 1024, "size of the daemon log file before rotation", minimum=4096,
        maximum=1 << 40, group="daemon",
    )  # fmt: skip
    daemon_log_backups: int = setting(
        3, "rotated daemon log files kept", minimum=0, maximum=1000, group="daemon"
    )

    # --- supervision --------------------------------------------------------------------------
    daemon_startup_deadline_s: float = setting(
        900.0,
        "time the daemon may take to answer GetStatus (the SRS load comes first)",
        minimum=1, maximum=DAY_S, group="supervision",
    )  # fmt: skip
    daemon_stop_grace_s: float = setting(
        10.0, "seconds between SIGTERM and SIGKILL", minimum=0, maximum=HOUR_S,
        group="supervision",
    )  # fmt: skip
    daemon_liveness_interval_s: float = setting(
        30.0,
        "GetStatus liveness probe cadence once ready (the daemon runs nvidia-smi for each)",
        minimum=0.1, maximum=HOUR_S, group="supervision",
    )  # fmt: skip
    daemon_liveness_timeout_s: float = setting(
        20.0, "deadline of one liveness probe", minimum=0.1, maximum=HOUR_S, group="supervision"
    )
    daemon_liveness_failures: int = setting(
        3, "missed probes in a row before a hung daemon is killed and restarted", minimum=1,
        maximum=1000, group="supervision",
    )  # fmt: skip
    restart_backoff_initial_s: float = setting(
        1.0, "first restart delay", minimum=0.01, maximum=HOUR_S, group="supervision"
    )
    restart_backoff_max_s: float = setting(
        60.0, "restart delay cap", minimum=0.01, maximum=DAY_S, group="supervision"
    )
    restart_stable_after_s: float = setting(
        600.0, "healthy this long resets the backoff", minimum=1, maximum=DAY_S,
        group="supervision",
    )  # fmt: skip
    crash_loop_failures: int = setting(
        5, "failures within the window that mean a crash loop", minimum=1, maximum=1000,
        group="supervision",
    )  # fmt: skip
    crash_loop_window_s: float = setting(
        300.0, "crash-loop window", minimum=1, maximum=DAY_S, group="supervision"
    )
    proactive_oom: bool = setting(
        True, "stop and step down before the kernel's OOM killer acts", group="supervision"
    )
    memory_sample_interval_s: float = setting(
        1.0,
        "seconds between memory samples while memory is ok (shorter than a proof's climb)",
        minimum=0.01, maximum=60, group="supervision",
    )  # fmt: skip
    memory_alert_sample_interval_s: float = setting(
        0.1,
        "seconds between memory samples while memory is at warn or critical",
        minimum=0.01, maximum=60, group="supervision",
    )  # fmt: skip

    # --- memory and plan ----------------------------------------------------------------------
    workers: int = setting(
        0, "partition_workers; 0: planned from memory", minimum=0, maximum=256, group="memory"
    )
    max_workers: int = setting(
        12, "most workers planned (more is slower)", minimum=1, maximum=256, group="memory"
    )
    warmup_workers: int = setting(
        2, "workers for the warmup proof", minimum=1, maximum=256, group="memory"
    )
    memory_base_gib: float = setting(
        69.0, "daemon RSS with SRS and PCE loaded", minimum=0, maximum=65_536, group="memory"
    )
    memory_per_worker_gib: float = setting(
        20.0, "peak RSS added by each partition worker", minimum=1, maximum=4096, group="memory"
    )
    memory_margin_fraction: float = setting(
        0.25,
        "share of the memory limit kept free (the rule's error at high worker counts)",
        minimum=0, maximum=0.9, group="memory",
    )  # fmt: skip
    memory_margin_min_gib: float = setting(
        4.0, "least memory kept free below the limit", minimum=0, maximum=65_536, group="memory"
    )
    plan_memory_scale: float = setting(
        1.0,
        "planned bytes per measured byte (1024 against the simulator's 1 MiB per GiB)",
        minimum=0.001, maximum=1_000_000, group="memory",
    )  # fmt: skip
    proc_root: Path = setting(
        Path("/proc"), "procfs root (tests point it at fixtures)", group="memory"
    )
    cgroup_root: Path | None = setting(
        None, "cgroup mount root; empty: found in /proc/self/mountinfo", group="memory"
    )
    gpu_probe: str = setting(
        "nvml", "GPU memory source", choices=("nvml", "sim", "none"), group="memory"
    )

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
        "",
        "shell command that downloads the proof parameters; empty: none",
        form="command", group="params",
    )  # fmt: skip
    params_expected: tuple[str, ...] = setting(
        (),
        "expected parameter files as NAME:BYTES (a file name in daemon_param_cache, at most "
        "1 TiB); all present: fetch skipped",
        form="expected_file", group="params", metavar="NAME:BYTES...",
    )  # fmt: skip
    params_progress_interval_s: float = setting(
        10.0, "cadence of parameter download progress lines", minimum=0.1, maximum=HOUR_S,
        group="params",
    )  # fmt: skip
    params_timeout_s: float = setting(
        5400.0,
        "longest the fetch command may run (the manager kills at 90 min in registered)",
        minimum=1, maximum=DAY_S, group="params",
    )  # fmt: skip

    # --- bench --------------------------------------------------------------------------------
    bench_count: int = setting(
        12, "proofs in the benchmark batch", minimum=1, maximum=10_000, group="bench"
    )
    bench_concurrency: int = setting(
        2, "benchmark proofs in flight", minimum=1, maximum=256, group="bench"
    )
    bench_budget_s: float = setting(
        2700.0, "the manager's benchmark budget (its 45 min timeout)", minimum=1, maximum=DAY_S,
        group="bench",
    )  # fmt: skip
    bench_min_proofs: int = setting(
        3,
        "completions a measurement needs; a bench interrupted with less reports a short rate",
        minimum=2, maximum=1000, group="bench",
    )  # fmt: skip
    bench_safety: float = setting(
        1.25,
        "estimated times are stretched by this before they are held against the budget",
        minimum=1, maximum=10, group="bench", metavar="FACTOR",
    )  # fmt: skip
    bench_precision: float = setting(
        0.01,
        "adaptive stop: the rate reported must be known within this fraction (its 95 % interval, "
        "from batch means of its completions): the batch ends "
        "early once it is, its verdict against min_rate certain, after bench_min_soak_s on a "
        "machine that holds still, never before bench_min_proofs (and 5) completions; it goes "
        "on past bench_count, up to bench_max_proofs, while it is not; 0 = off: the whole "
        "bench_count batch",
        minimum=0, maximum=0.5, group="bench", metavar="FRACTION",
    )  # fmt: skip
    bench_min_soak_s: float = setting(
        600.0,
        "adaptive stop: daemon seconds from the batch's start before it may end early (a GPU "
        "reaching its power cap, a CPU warming into its throttle, slow down after minutes)",
        minimum=0, maximum=DAY_S, group="bench",
    )  # fmt: skip
    bench_max_proofs: int = setting(
        36,
        "adaptive stop: most proofs the batch goes on to, past bench_count, while the rate it "
        "would report is not known within bench_precision (99 %) or too close to min_rate to "
        "tell (the budget still bounds it; never fewer than bench_count)",
        minimum=1, maximum=10_000, group="bench",
    )  # fmt: skip
    bench_status_sample_s: float = setting(
        0.5,
        "seconds between samples of the daemon's HTTP status while the bench measures (what "
        "bounds the rate: bench.result's bound); 0 = off",
        minimum=0, maximum=60, group="bench",
    )  # fmt: skip
    restart_after_warmup: bool = setting(
        True,
        "restart at full workers after the warmup (off for the budget release: it loses the PCE)",
        group="bench",
    )
    rate_time_scale: float = setting(
        1.0,
        "daemon seconds per wall second: rates are reported in the daemon's clock (the "
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
    # The run phase's health watch (README "The run phase"; core.health, core.healthladder).
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

    # --- health server ------------------------------------------------------------------------
    health_enabled: bool = setting(True, "serve /healthz /readyz /metrics", group="health")
    health_listen: str = setting(
        "127.0.0.1:9822",
        "health server address, ip:port",
        form="health_listen", group="health",
    )  # fmt: skip
    health_allow_public: bool = setting(
        False,
        "allow a non-loopback health_listen (e.g. 0.0.0.0 in a pod, for the kubelet's probes)",
        group="health",
    )

    def __post_init__(self) -> None:
        for name, relation, other, why in RELATIONS:
            value, bound = getattr(self, name), getattr(self, other)
            if not compares(value, relation, bound):
                raise UsageError(
                    f"setting {name}={value:g}: must be {relation} {other} ({bound:g}){why}"
                )
        if self.manager_url and urlsplit(self.manager_url).scheme not in ("http", "https"):
            raise UsageError(
                f"setting manager_url={redact_url(self.manager_url)!r}: must be an http(s) URL"
            )
        for name in ("daemon_listen", "daemon_status_listen"):
            # The daemon has no auth and no TLS: public only when the operator asks.
            public_listen_warning(self, name)
        for entry in self.params_expected:
            _, sep, size = entry.rpartition(":")
            if not sep or not size.isdigit():
                raise UsageError(f"setting params_expected: {entry!r} is not NAME:BYTES")


# (setting, relation, other setting, why): checked once each is within its own range.
RELATIONS: tuple[tuple[str, Comparison, str, str], ...] = (
    ("warmup_workers", "<=", "max_workers", ""),
    ("restart_backoff_max_s", ">=", "restart_backoff_initial_s", ""),
    ("manager_backoff_max_s", ">=", "manager_backoff_initial_s", ""),
    ("memory_alert_sample_interval_s", "<=", "memory_sample_interval_s",
     "; memory at risk is sampled more often"),
)  # fmt: skip


def public_listen_warning(s: Settings, name: str) -> str | None:
    """For a daemon address setting: UsageError when public and not allowed, the warning to
    log when public and allowed (``allow_public_listen``), None when loopback or unset."""
    listen: str = getattr(s, name)
    if not listen:
        return None  # the unix socket in run_dir
    return check_public(
        name,
        listen,
        is_loopback=parse_address(listen).is_loopback,
        allow_public=s.allow_public_listen,
        allow_setting="allow_public_listen",
    )
