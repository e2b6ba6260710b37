"""Exit codes of ``cuzk-supervisor``; the README's table is written from these."""

from __future__ import annotations

OK = 0
# A command ran but its work failed (e.g. a proof batch with failed proofs).
FAILURE = 1
# Bad input or configuration: nothing was started.
USAGE = 2
# Interrupted by a signal: 128 + the signal number (143 for SIGTERM, 130 for SIGINT).
SIGNAL_BASE = 128
# The daemon failed to start: binary missing or not executable, address in use, never ready.
DAEMON_FAILED_TO_START = 3
# The daemon crash-looped: too many failures within the restart policy's window.
DAEMON_CRASH_LOOP = 4
