"""The words of a report to the manager: its kinds and how it can end (plain data, no I/O).

The outbox (:mod:`cuzk_supervisor.adapters.state.store`,
:mod:`cuzk_supervisor.adapters.manager.client`) stores reports with these;
:mod:`cuzk_supervisor.core.reconcile` decides with them.
"""

from __future__ import annotations

# Report kinds that go through the outbox (register is synchronous: we need its answer).
PARAM_DONE = "param_done"
BENCH_DONE = "bench_done"
RUNNING = "running"
REPORT_KINDS = frozenset({PARAM_DONE, BENCH_DONE, RUNNING})

# How a report ended (None while it is pending).
OUTCOME_OK = "ok"
OUTCOME_GONE = "gone"
OUTCOME_REJECTED = "rejected"
REPORT_OUTCOMES = frozenset({OUTCOME_OK, OUTCOME_GONE, OUTCOME_REJECTED})
