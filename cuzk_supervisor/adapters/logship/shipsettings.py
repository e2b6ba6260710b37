"""The log shipper's settings (``ShipperSettings``), checked; the composition root fills them
from :class:`~cuzk_supervisor.settings.Settings` (``settings.policies``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cuzk_supervisor.adapters.logship.push import MAX_BODY_BYTES
from cuzk_supervisor.core import logbudget
from cuzk_supervisor.core.checks import (
    POSITIVE,
    in_range,
    int_at_least,
    require_fields,
    require_relation,
)
from cuzk_supervisor.core.jitter import DEFAULT_SPREAD, MAX_SPREAD

__all__ = ["MIN_PUSH_BYTES", "ShipperSettings"]

MIB = 1024 * 1024
MIN_PUSH_BYTES = 200
"""A source whose share of a turn is smaller waits for a later turn (no push of a summary
alone, nor of a line cut to nothing)."""


@dataclass(frozen=True, slots=True)
class ShipperSettings:
    bytes_per_min: float = logbudget.BEFORE_RUN.bytes_per_min
    """Before the run phase: bytes of lines pushed a minute, on average."""
    run_bytes_per_min: float = logbudget.RUN.bytes_per_min
    """In the run phase: the same."""
    run_interval_s: float = logbudget.RUN.interval_s
    """In the run phase: a turn this often."""
    interval_s: float = logbudget.BEFORE_RUN.interval_s
    """Before the run phase: a turn this often."""
    max_line_bytes: int = 2000
    """A longer line is cut, with a marker saying how much (the budget is bytes)."""
    max_buffer_lines: int = 10_000
    """Lines kept while waiting (what the manager keeps of an instance); beyond it the oldest
    routine lines are dropped (and counted), milestones only when no routine line is left."""
    max_buffer_bytes: int = 16 * MIB
    """Bytes kept while waiting; beyond it, as ``max_buffer_lines``."""
    milestone_backlog_s: float = 600.0
    """Milestones that do not fit a turn wait for the next ones, up to this many seconds of the
    phase's byte budget; past it the middle ones are summarised, the first and last kept."""
    child_head_lines: int = 10
    """A child's first lines after each start are milestones."""
    child_tail_lines: int = 10
    """A child's last lines before each exit are milestones."""
    final_flush_s: float = 5.0
    """Time given to the last turn when the shipper stops."""
    final_requests: int = 4
    """Tabs whose lines a turn out of turn pushes (the health watch's reason, the last turn);
    the last turn pushes each other tab with anything waiting as its count alone (the dashboard
    has five)."""
    final_bytes: int = 8000
    """Bytes of lines at most in such a turn (besides the count lines)."""
    jitter: float = DEFAULT_SPREAD
    """Each turn's wait varied by up to this fraction either way."""

    def __post_init__(self) -> None:
        require_fields(
            self, ("bytes_per_min", "run_bytes_per_min", "run_interval_s", "interval_s",
                   "final_flush_s", "milestone_backlog_s"), POSITIVE,
        )  # fmt: skip
        require_fields(self, ("jitter",), in_range(0, MAX_SPREAD))
        require_fields(self, ("max_line_bytes",), in_range(256, MAX_BODY_BYTES - 1))
        require_fields(self, ("max_buffer_lines", "final_requests"), int_at_least(1))
        require_fields(self, ("final_bytes",), int_at_least(MIN_PUSH_BYTES))
        require_fields(self, ("child_head_lines", "child_tail_lines"), int_at_least(0))
        # One line must always fit in the buffer.
        require_relation(self, "max_buffer_bytes", ">", "max_line_bytes")

    def budget(self, run_phase: bool) -> logbudget.Budget:
        """The phase's budget with these settings' byte rate and turn interval (its requests
        a minute scaled with the interval: the same pushes a turn)."""
        base = logbudget.RUN if run_phase else logbudget.BEFORE_RUN
        interval = self.run_interval_s if run_phase else self.interval_s
        budget = base.with_bytes(self.run_bytes_per_min if run_phase else self.bytes_per_min)
        per_min = base.requests_per_min * base.interval_s / interval
        return dataclasses.replace(budget, interval_s=interval, requests_per_min=per_min)
