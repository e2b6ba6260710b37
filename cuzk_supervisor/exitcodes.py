"""Exit codes of ``cuzk-supervisor``; the README's table is written from these."""

from __future__ import annotations

OK = 0
# A command ran but its work failed (e.g. a proof batch with failed proofs).
FAILURE = 1
# Bad input or configuration: nothing was started.
USAGE = 2
# Interrupted by a signal: 128 + the signal number (143 for SIGTERM, 130 for SIGINT).
SIGNAL_BASE = 128
# The daemon failed to start: binary missing or not executable, address in use, never ready, or
# its config, socket folder or log file cannot be written (run or log folder full or unwritable);
# for ``prove``: no daemon answered at the address within its ready deadline.
DAEMON_FAILED_TO_START = 3
# The daemon crash-looped: too many failures within the restart policy's window.
DAEMON_CRASH_LOOP = 4
# Out of memory: no plan fits the memory limit, or still out of memory at 1 worker.
OUT_OF_MEMORY = 5
# The benchmark failed: below min_rate (the manager said passed: false) or no proof completed.
BENCH_FAILED = 6
# The manager no longer knows this instance (404): it was killed; we stopped cleanly.
INSTANCE_GONE = 7
# The proof parameters could not be made ready (fetch failed, hung, or wrong files).
PARAMS_FAILED = 8
# The state file cannot be written (folder not writable, disk full): nothing is safe to report.
STATE_UNWRITABLE = 9
