"""recorded_outcome: what the manager's GET /status record says became of a queued report.

Pure: the decision only; the outbox stamps the report with it."""

from __future__ import annotations

from typing import Any

import pytest

from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.core.reconcile import (
    Recorded,
    find_record,
    recorded_outcome,
)
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_GONE, OUTCOME_OK, PARAM_DONE, RUNNING


def record(state: str, **fields: Any) -> dict[str, Any]:
    return {"uuid": "u-1", "label": "C.1", "runner_id": 1, "state": state, "min_rate": 30.0,
            "registered_at": 1.0, **fields}  # fmt: skip


PARAM = Report(kind=PARAM_DONE, uuid="u-1")
BENCH_PASS = Report(kind=BENCH_DONE, uuid="u-1", rate=41.32)
BENCH_FAIL = Report(kind=BENCH_DONE, uuid="u-1", rate=12.5)


@pytest.mark.parametrize(
    ("report", "rec", "outcome", "passed"),
    [
        # Not listed, or listed without the report applied: send it.
        (PARAM, None, None, None),
        (PARAM, record("registered"), None, None),
        (BENCH_PASS, record("params_done", param_done_at=2.0), None, None),
        # Applied already.
        (PARAM, record("params_done", param_done_at=2.0), OUTCOME_OK, None),
        (PARAM, record("running", param_done_at=2.0), OUTCOME_OK, None),
        (BENCH_PASS, record("bench_done", bench_rate=41.32, bench_done_at=3.0), OUTCOME_OK, True),
        (BENCH_PASS, record("running", bench_rate=41.32, bench_done_at=3.0), OUTCOME_OK, True),
        # A pass of another rate (an earlier benchmark): ours was not applied.
        (BENCH_PASS, record("bench_done", bench_rate=35.9, bench_done_at=3.0), None, None),
        # A failing rate on a killed instance: the verdict is "failed", whatever killed it.
        (BENCH_FAIL, record("killed", kill_reason="bench rate 12.5 < 30"), OUTCOME_OK, False),
        # Killed meanwhile for another reason: gone, never revived by a resend.
        (BENCH_PASS, record("killed", kill_reason="benchmark timeout"), OUTCOME_GONE, None),
        (PARAM, record("killed", param_done_at=2.0, kill_reason="manual"), OUTCOME_GONE, None),
    ],
)
def test_recorded_outcome(report, rec, outcome, passed):
    done = recorded_outcome(report, rec)
    if outcome is None:
        assert done is None
        return
    assert isinstance(done, Recorded)
    assert (done.outcome, done.passed) == (outcome, passed)
    assert done.detail
    # The report itself is finished with it (id kept, time stamped) by the outbox:
    # tests/test_manager_client.py, test_a_report_applied_just_before_a_crash_is_not_sent_again.


def test_a_gone_report_says_why_the_instance_was_killed():
    done = recorded_outcome(BENCH_PASS, record("killed", kill_reason="benchmark timeout"))
    assert done is not None
    assert "benchmark timeout" in done.detail


def test_running_is_never_looked_up():
    # /running is the run phase's repeated liveness ping: sending it again is what it is for.
    assert recorded_outcome(Report(kind=RUNNING, uuid="u-1"), record("running")) is None


def test_find_record_picks_this_instance():
    ours = record("running")
    listing = [record("killed") | {"uuid": "other"}, "junk", ours]
    assert find_record(listing, "u-1") is ours
    assert find_record(listing, "missing") is None
    with pytest.raises(ValueError, match="not a list"):
        find_record({"error": "nope"}, "u-1")
