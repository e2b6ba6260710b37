"""A run without a manager (``manager_url`` empty): the client answers every report locally and
logs it once; nobody judges a rate, and a failure report is never called a pass."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.core.reports import BENCH_DONE, PARAM_DONE, RUNNING


async def test_without_a_manager_reports_are_only_logged():
    async with ManagerClient(None) as client:
        assert client.is_local
        with capture_logs() as logs:
            registration = await client.register("C.9", 30)
            await client.param_done(registration.uuid)
            verdict = await client.bench_done(registration.uuid, 1.0)
            await client.running(registration.uuid)
            assert await client.push_logs(registration.uuid, "cuzk", ["x"]) == 0
    assert registration.local
    assert registration.uuid == "local-C.9"
    assert verdict.passed
    assert not verdict.checked
    skipped = [e for e in logs if e["event"] == "manager.report_skipped"]
    assert [e["call"] for e in skipped] == ["register", PARAM_DONE, BENCH_DONE, RUNNING]
    assert skipped[2]["payload"] == {"uuid": "local-C.9", "rate": 1.0}
    assert skipped[2]["judged"] is False
    assert "passed" not in skipped[2]  # nobody judged it: nothing is said about a verdict
    assert "passed" not in skipped[2]["note"]


async def test_a_local_failure_report_is_never_called_a_pass():
    """Issue 14.7: with no manager, the rate-0 failure report used to log ``passed=True ...
    assumed passed``; a failure is now a failure (False), and nothing claims a pass."""
    async with ManagerClient(None) as client:
        with capture_logs() as logs:
            verdict = await client.bench_done("local-C.9", 0.0)
    assert verdict.passed is False
    assert not verdict.checked
    (line,) = [e for e in logs if e["event"] == "manager.report_skipped"]
    assert "passed" not in line
    assert "failure report" in line["note"]
    assert "pass" not in line["note"]


async def test_a_repeated_local_report_is_logged_once():
    """Issue 14.7: the /running ping of a local run logged ``report_skipped`` at every
    interval; the same report again is debug only, a different one is logged."""
    async with ManagerClient(None) as client:
        with capture_logs() as logs:
            for _ in range(5):
                await client.running("local-C.9")
            await client.param_done("local-C.9")
    levels = [(e["call"], e["log_level"]) for e in logs if e["event"] == "manager.report_skipped"]
    assert levels == [(RUNNING, "info"), *[(RUNNING, "debug")] * 4, (PARAM_DONE, "info")]


def test_a_manager_url_needs_a_scheme():
    with pytest.raises(ValueError, match="http"):
        ManagerClient("manager:8080")
