"""The settings of the edges: the manager, the supervisor's log lines, its folders, the daemon."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuzk_supervisor.settings.declare import DAY_S, HOUR_S, LOG_LEVELS, setting


@dataclass(frozen=True)
class EdgeFields:
    # --- manager ------------------------------------------------------------------------------
    label: str = setting(
        "", "instance label sent to /register (letters, digits and . _ : @ + -, at most 128); "
        "empty: VAST_CONTAINERLABEL", form="label", max_length=128, group="manager",
    )  # fmt: skip
    min_rate: float = setting(
        0.0, "minimum proofs/hour to pass the bench; 0: MIN_RATE, else the manager's default (50)",
        minimum=0, maximum=100_000, group="manager", metavar="RATE",
    )  # fmt: skip
    manager_url: str = setting(
        "", "fleet manager base URL (http or https); empty: local run, reports only logged",
        form="url", max_length=2048, group="manager",
    )  # fmt: skip
    manager_token: str = setting(
        "", "bearer token sent to the manager, for deployments behind an authenticating proxy",
        secret=True, form="token", group="manager",
    )  # fmt: skip
    manager_connect_timeout_s: float = setting(
        3.0, "connect timeout of one manager request", minimum=0.1, maximum=600, group="manager"
    )
    manager_read_timeout_s: float = setting(
        10.0, "read timeout of one manager request", minimum=0.1, maximum=3600, group="manager"
    )
    manager_retry_s: float = setting(
        120.0, "how long one report is retried before it is left in the outbox for later",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_backoff_initial_s: float = setting(
        0.5, "first pause before a failed manager request is tried again (full jitter, doubled at "
        "each consecutive failure of any call up to manager_backoff_max_s)",
        minimum=0.01, maximum=600, group="manager",
    )  # fmt: skip
    manager_backoff_max_s: float = setting(
        120.0, "longest pause between two tries of a manager request; one backoff per manager, "
        "shared by every call, so a fleet probes a manager that is away at about one request per "
        "machine per half of this, and comes back from an outage spread over it",
        minimum=0.01, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    manager_retry_after_max_s: float = setting(
        600.0, "longest Retry-After (on a 429 or 503) honoured; no request goes before it, and a "
        "longer one is cut to this", minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_jitter: float = setting(
        0.2, "every periodic manager-facing timer (status line, kill look-up, /running ping, log "
        "flush) fires first at a random point of its interval, then varies each interval by up to "
        "this fraction of it either way, so a fleet started together does not stay in step",
        minimum=0, maximum=0.5, group="manager", metavar="FRACTION",
    )  # fmt: skip
    status_interval_s: float = setting(
        60.0, "cadence of status lines pushed to the manager in long phases and the run phase",
        minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    running_ping_interval_s: float = setting(
        300.0, "cadence of the repeated /running in the run phase, the run phase's kill look-up "
        "(it answers 404 once killed; each one is a line in the manager's own 5,000-line log, "
        "shared by the fleet)", minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_status_lookup_s: float = setting(
        0.0, "before the run phase, how often the manager's whole table (GET /status) is read to "
        "find a kill from the dashboard; 0: never periodically (a /running before /bench-done asks "
        "instead; each read costs the manager its whole table, about 290 bytes per instance it "
        "knows)",
        minimum=0, maximum=DAY_S, group="manager",
    )  # fmt: skip
    manager_status_read_s: float = setting(
        30.0, "how long the check before /bench-done (one /running, answered 404 once the record "
        "is killed) or one read of the manager's whole table is retried (the manager away, or "
        "answering what cannot be its own) before going on without it: the report is then sent "
        "unchecked; for the bench clock, at most 10 s of it",
        minimum=0.1, maximum=DAY_S, group="manager",
    )  # fmt: skip
    log_push: bool = setting(True, "push log lines to the manager's log endpoint", group="manager")
    log_buffer_lines: int = setting(
        10_000, "log lines kept for the manager while it is away (the manager keeps 10,000 per "
        "instance); past this the oldest are dropped, and one line says how many",
        minimum=100, maximum=10_000, group="manager", metavar="LINES",
    )  # fmt: skip
    log_push_interval_s: float = setting(
        120.0, "in the run phase, how often the log lines waiting are pushed to the manager (one "
        "push per tab that has lines, 1 push a minute at 120 s; before the run phase: "
        "log_push_early_interval_s)", minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    log_push_early_interval_s: float = setting(
        20.0, "before the run phase, how often the log lines waiting are pushed to the manager "
        "(one push per tab that has lines, 4 pushes a minute at 20 s; the dashboard shows "
        "progress at least every 30 s with the jitter)",
        minimum=0.1, maximum=HOUR_S, group="manager",
    )  # fmt: skip
    log_budget_bytes_per_min: float = setting(
        12_000.0, "before the run phase, bytes of log lines pushed to the manager a minute on "
        "average, whatever the fetch and the daemon write: each push sends every milestone "
        "(phases, reports, warnings, a child's first, ready, error and last lines), then the "
        "newest routine lines that fit; one line counts the rest by kind",
        minimum=500, maximum=500_000, group="manager", metavar="BYTES",
    )  # fmt: skip
    log_run_budget_bytes_per_min: float = setting(
        2_400.0, "in the run phase, bytes of log lines pushed to the manager a minute on average, "
        "whatever the daemon writes; as log_budget_bytes_per_min",
        minimum=200, maximum=500_000, group="manager", metavar="BYTES",
    )  # fmt: skip
    manager_weather_s: float = setting(
        600.0, "how long the manager's URL may answer with pages that are not the manager's own "
        "word (a proxy's HTML, plain or empty 404, 401, 403, 413, 5xx ...) before one clear "
        "warning says so (setup tab, terminal, /metrics); such answers never end an instance",
        minimum=1, maximum=DAY_S, group="manager",
    )  # fmt: skip

    # --- logging ------------------------------------------------------------------------------
    log_level: str = setting(
        "info", "supervisor log level", choices=LOG_LEVELS, group="logging", metavar="LEVEL"
    )
    log_format: str = setting(
        "auto", "auto: JSON lines on stderr off a terminal; on one, a person's view for run, sim "
        "and prove (run and sim write the JSON lines to log_dir/supervisor.log), colour for the "
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
        "", "daemon gRPC address, ip:port or unix:///path; empty: unix socket in run_dir "
        "(loopback only unless allow_public_listen)", form="optional_address", group="daemon",
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
        "info", "daemon log level or filter (e.g. info, or cuzk=debug,info)",
        form="log_filter", max_length=512, group="daemon",
    )  # fmt: skip
    daemon_log_max_bytes: int = setting(
        64 * 1024 * 1024, "size of the daemon log file before rotation", minimum=4096,
        maximum=1 << 40, group="daemon",
    )  # fmt: skip
    daemon_log_backups: int = setting(
        3, "rotated daemon log files kept", minimum=0, maximum=1000, group="daemon"
    )
