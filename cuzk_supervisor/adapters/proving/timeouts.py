"""The proving client's deadlines and budgets, as one plain value (they become settings).

Apart from the retry policies that use them (``policy``), so that the composition root can make
and check them when it builds the lifecycle without loading gRPC: the gRPC client is made, and
gRPC imported, only when the daemon is first asked something (``compose.build_lifecycle``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuzk_supervisor.core.checks import POSITIVE, Rule, require_fields, require_relation

# GetStatus runs nvidia-smi on the real daemon: never poll it faster than this.
MIN_READY_POLL_INTERVAL_S = 0.25
_READY_POLL_INTERVAL = Rule(
    lambda v: v >= MIN_READY_POLL_INTERVAL_S,
    f">= {MIN_READY_POLL_INTERVAL_S} s (GetStatus runs nvidia-smi)",
)


@dataclass(frozen=True, slots=True)
class ProvingTimeouts:
    """Every deadline and budget of the proving client. A plain value: these become settings."""

    submit_deadline_s: float = 60.0
    """Deadline of one SubmitProof call; it uploads the ~51 MB C1 input, hence longer than an
    await's. When it passes, the job is awaited before anything is submitted again."""
    await_deadline_s: float = 30.0
    """Our deadline on each AwaitProof call. Short on purpose: the real server ignores
    ``timeout_ms`` and holds the call until the proof ends; a cut call is just awaited again."""
    proof_budget_s: float = 3600.0
    """Total time for one proof from its first submit to its result, across every retry. Sized
    for warmup-scale first proofs (no PCE cache yet); callers pass their own per proof."""
    call_deadline_s: float = 10.0
    """Deadline of a short call: GetStatus (the daemon runs nvidia-smi for it), GetMetrics."""
    ready_poll_interval_s: float = 0.25
    """Least time between two GetStatus calls while waiting for readiness (at least 0.25 s)."""
    ready_poll_max_s: float = 0.5
    """Longest wait between two readiness polls (the backoff's cap while starting)."""
    startup_deadline_s: float = 300.0
    """How long :meth:`ProvingClient.wait_ready` keeps asking before DaemonNotReady."""
    backoff_base_s: float = 0.5
    """First wait before retrying a transient failure (jittered, doubled each attempt)."""
    backoff_max_s: float = 10.0
    """Longest wait between two retries of a transient failure."""

    def __post_init__(self) -> None:
        require_fields(
            self, ("submit_deadline_s", "await_deadline_s", "proof_budget_s", "call_deadline_s",
                   "startup_deadline_s", "backoff_base_s"), POSITIVE,
        )  # fmt: skip
        require_fields(self, ("ready_poll_interval_s",), _READY_POLL_INTERVAL)
        require_relation(self, "ready_poll_max_s", ">=", "ready_poll_interval_s")
        require_relation(self, "backoff_max_s", ">=", "backoff_base_s")
