"""Exit codes of ``cuzk-supervisor``; the README's table is generated from ``MEANINGS``.

One meaning per code. The boundary between 2 and the codes of a failed write (3 for the daemon's
files, 9 for the state file): 2 is what the operator gave that is found wrong when it is looked
at before anything starts (a value, an input file, a folder that cannot be written or made);
3 and 9 are a write that fails once the run has started (a full disk, an I/O error, a folder
made read-only since the start, a FIFO or device where the file should be).
"""

from __future__ import annotations

OK = 0
FAILURE = 1
USAGE = 2
DAEMON_FAILED_TO_START = 3
DAEMON_CRASH_LOOP = 4
OUT_OF_MEMORY = 5
BENCH_FAILED = 6
INSTANCE_GONE = 7
PARAMS_FAILED = 8
STATE_UNWRITABLE = 9
HEALTH_BROKEN = 10
# Interrupted by a signal: 128 + the signal number (143 for SIGTERM, 130 for SIGINT).
SIGNAL_BASE = 128

MEANINGS: dict[int, str] = {
    OK: "done (or stopped cleanly by `--exit-after-run`)",
    FAILURE: "the work failed (e.g. a proof in a `prove` batch failed; `doctor` found a problem)",
    USAGE: "bad input or configuration, looked at before anything starts: a setting, an input "
    "file (the C1 file, the daemon base config), a daemon binary that cannot run, a folder "
    "(`daemon_param_cache`, `state_dir`, `run_dir`, `log_dir`) that cannot be written or made "
    "(read-only, not a folder, under a file), a unix socket path over the kernel's 107 bytes, "
    "too little disk for the parameters and PCE files (`doctor`'s figures), a simulator fault "
    "switch that does not parse; nothing was registered, started or written",
    DAEMON_FAILED_TO_START: "the daemon failed to start (address in use, never ready, a binary "
    "gone since the start; a write of its config, socket or log file failed once the run had "
    "started: `run_dir` or `log_dir` full, or a FIFO or device where the file should be); for "
    "`prove`: no daemon answered at the address within `--ready-deadline-s`",
    DAEMON_CRASH_LOOP: "the daemon crash-looped (too many failures within the restart window)",
    OUT_OF_MEMORY: "out of memory: no plan fits the limit, or still out of memory at 1 worker",
    BENCH_FAILED: "the benchmark failed: below `min_rate` (the manager said `passed: false`) or "
    "no proof completed",
    INSTANCE_GONE: "the manager no longer knows this instance (404): it was killed; we stopped "
    "cleanly",
    PARAMS_FAILED: "the proof parameters could not be made ready (fetch failed, hung, or wrong "
    "files; another supervisor's fetch into the same folder still held the params lock after "
    "`params_lock_wait_s`)",
    STATE_UNWRITABLE: "a write of the state file failed once the run had started (disk full, an "
    "I/O error, `state_dir` made read-only since the start); a `state_dir` found unwritable "
    "before the start is exit 2",
    HEALTH_BROKEN: "the run phase found the machine broken (a GPU lost, every proof failing after "
    "a daemon restart, ...) and told the manager, which ended the instance (docs/run-phase.md)",
}
SIGNAL_MEANING = "stopped by signal N (143 for SIGTERM, 130 for SIGINT)"


def markdown_table() -> str:
    """The README's exit-code table: one row per code."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {code} | {meaning} |" for code, meaning in MEANINGS.items()]
    rows.append(f"| {SIGNAL_BASE} + N | {SIGNAL_MEANING} |")
    return "\n".join(rows)
