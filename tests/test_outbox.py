"""The durable outbox of reports to the manager, against the scripted manager (``scripted``):
a report on disk before it is sent, sent once after a restart, looked up in ``GET /status``
before it is sent again, order kept across an outage, final only on the manager's own word."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from scripted import (
    FAST,
    GONE,
    ScriptedManager,
    SimulatedCrash,
    TickingClock,
    open_outbox,
)
from structlog.testing import capture_logs

from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import InstanceGone, ManagerUnavailable
from cuzk_supervisor.adapters.manager.wire import ConnectFailed
from cuzk_supervisor.adapters.state.doc import Report
from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore, StateWriteError
from cuzk_supervisor.core.reports import (
    BENCH_DONE,
    OUTCOME_GONE,
    OUTCOME_OK,
    OUTCOME_REJECTED,
    PARAM_DONE,
    RUNNING,
)


@pytest.fixture
def manager() -> ScriptedManager:
    return ScriptedManager()


# --- the outbox ---------------------------------------------------------------------------------


async def test_a_report_is_on_disk_before_it_is_sent(tmp_path, manager):
    path = tmp_path / "state.json"
    seen_on_disk: list[list[str]] = []
    manager.on_request = lambda _: seen_on_disk.append(
        [r.id for r in StateStore(path).load().outbox]
    )
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        report = Report(kind=PARAM_DONE, uuid="u-1")
        done = await outbox.send_now(report)
    assert seen_on_disk == [[report.id]]
    assert done.outcome == OUTCOME_OK
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert [r.id for r in on_disk.acked] == [report.id]


async def test_a_report_queued_before_a_crash_is_sent_once_after_the_restart(tmp_path, manager):
    path = tmp_path / "state.json"
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        report = Report(kind=RUNNING, uuid="u-1")
        await outbox.enqueue(report)
        # Crash: the process is gone before anything was sent.
    assert manager.requests == []
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        assert [r.id for r in outbox.pending] == [report.id]
        result = await outbox.drain()
    assert [r.id for r in result.sent] == [report.id]
    assert result.pending == 0
    assert result.error is None
    assert manager.paths() == ["/running"]
    assert StateStore(path).load().outbox == ()


async def test_a_crash_during_the_send_resends_after_the_restart(tmp_path):
    path = tmp_path / "state.json"
    first = ScriptedManager()
    first.fail("/bench-done", SimulatedCrash())
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with first.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(SimulatedCrash):
            await outbox.send_now(report)
    second = ScriptedManager()
    async with second.client() as client:
        _, outbox = open_outbox(path, client)
        # The lifecycle resumes: the bench report it queued is still there, with the same id.
        again = outbox.latest(BENCH_DONE)
        assert again is not None
        assert again.id == report.id
        done = await outbox.send_now(again)
    assert done.passed is True
    # The manager's records do not show it applied: it is sent again.
    assert second.paths() == ["/status", "/bench-done"]
    assert json.loads(second.requests[1].content) == {"uuid": "u-1", "rate": 60.0}


async def test_a_verdict_acknowledged_before_a_crash_is_not_sent_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=40.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        first = await outbox.send_now(report)
        # Crash before the lifecycle wrote what it did with the verdict.
    assert first.passed is False
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        known = outbox.latest(BENCH_DONE)
        assert known is not None
        assert known.outcome == OUTCOME_OK
        again = await outbox.send_now(known)
    assert again.passed is False
    assert manager.paths() == ["/bench-done"]


def crash_after_the_answer(path: Path, client: ManagerClient) -> Outbox:
    """An outbox whose process dies right after the manager answered a report, before the
    answer reached the state file (the second save: the first one queued the report)."""
    keeper = StateKeeper(StateStore(path))
    saves = 0

    async def save(pending: tuple[Report, ...], acked: tuple[Report, ...]) -> None:
        nonlocal saves
        saves += 1
        if saves == 2:
            raise SimulatedCrash()
        await keeper.save_outbox(pending, acked)

    return Outbox(client, save)


@pytest.mark.parametrize(("rate", "passed"), [(60.0, True), (40.0, False)])
async def test_a_report_applied_just_before_a_crash_is_not_sent_again(
    tmp_path, manager, rate, passed
):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=rate)
    async with manager.client() as client:
        with pytest.raises(SimulatedCrash):
            await crash_after_the_answer(path, client).send_now(report)
    assert [r.id for r in StateStore(path).load().outbox] == [report.id]
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with capture_logs() as logs:
            result = await outbox.drain()
    # The verdict is read from the manager's records, not asked for a second time.
    assert manager.paths() == ["/bench-done", "/status"]
    assert [(r.id, r.outcome, r.passed) for r in result.sent] == [(report.id, OUTCOME_OK, passed)]
    assert any(e["event"] == "manager.report_reconciled" for e in logs)
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert on_disk.acked[-1].passed is passed
    assert on_disk.acked[-1].finished_at is not None


async def test_param_done_applied_just_before_a_crash_is_not_sent_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=PARAM_DONE, uuid="u-1")
    async with manager.client() as client:
        with pytest.raises(SimulatedCrash):
            await crash_after_the_answer(path, client).send_now(report)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        done = await outbox.send_now(report)
    assert done.outcome == OUTCOME_OK
    assert manager.paths() == ["/param-done", "/status"]


async def test_a_queued_bench_report_is_not_sent_to_an_instance_killed_meanwhile(tmp_path, manager):
    # The manager does not check the state on /bench-done: a resend would revive the instance.
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.record = {"uuid": "u-1", "state": "killed", "min_rate": 50.0,
                      "kill_reason": "benchmark timeout"}  # fmt: skip
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(InstanceGone, match="benchmark timeout"):
            await outbox.send_now(report)
    assert manager.paths() == ["/status"]
    assert StateStore(path).load().acked[-1].outcome == OUTCOME_GONE


@pytest.mark.parametrize("status", [404, 403, 405])
async def test_a_manager_without_a_usable_status_gets_the_report_again(tmp_path, manager, status):
    """A proxy that keeps answering ``GET /status`` with its page (the dashboard's API behind
    its login, say): weather until the look-up's stop, then at-least-once delivery."""
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.fail("/status", *[(status, "<html><title>no</title></html>")] * 1000)
    retry = dataclasses.replace(FAST, report_stop_s=50.0)
    async with manager.client(retry=retry, clock=TickingClock(manager, 20.0)) as client:
        _, outbox = open_outbox(path, client)
        with capture_logs() as logs:
            done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths()[-1] == "/bench-done"
    assert set(manager.paths()[:-1]) == {"/status"}
    assert any(e["event"] == "manager.reconcile_skipped" for e in logs)


async def test_a_status_page_mangled_by_a_proxy_is_looked_up_again(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.record = {"uuid": "u-1", "state": "bench_done", "bench_rate": 60.0, "min_rate": 50.0}
    manager.fail("/status", (200, "<html>proxy</html>"))
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths() == ["/status", "/status"]  # reconciled: not sent again


async def test_a_manager_away_at_the_lookup_keeps_the_report_queued(tmp_path, manager):
    path = tmp_path / "state.json"
    report = Report(kind=PARAM_DONE, uuid="u-1")
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        await outbox.enqueue(report)
    manager.fail("/status", *([503] * 1000))
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        result = await outbox.drain(deadline_s=0.1)
        assert result.pending == 1
        assert isinstance(result.error, ManagerUnavailable)
        assert "/param-done" not in manager.paths()
        # Back: looked up, not applied yet, so sent; once.
        manager.steps["/status"].clear()
        result = await outbox.drain()
    assert [r.outcome for r in result.sent] == [OUTCOME_OK]
    assert manager.paths().count("/param-done") == 1


async def test_order_is_kept_across_an_outage(tmp_path, manager):
    path = tmp_path / "state.json"
    manager.fail("/param-done", *([ConnectFailed] * 1000))
    reports = [
        Report(kind=PARAM_DONE, uuid="u-1"),
        Report(kind=BENCH_DONE, uuid="u-1", rate=55.0),
        Report(kind=RUNNING, uuid="u-1"),
    ]
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        for report in reports:
            await outbox.enqueue(report)
        result = await outbox.drain(deadline_s=0.05)
        assert isinstance(result.error, ManagerUnavailable)
        assert result.pending == 3
        # The manager is back.
        manager.steps["/param-done"].clear()
        manager.requests.clear()
        result = await outbox.drain()
    assert manager.paths() == ["/param-done", "/bench-done", "/running"]
    assert [r.id for r in result.sent] == [r.id for r in reports]
    assert result.sent[1].passed is True


async def test_send_now_sends_earlier_reports_first_and_returns_the_verdict(tmp_path, manager):
    async with manager.client() as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        await outbox.enqueue(Report(kind=PARAM_DONE, uuid="u-1"))
        done = await outbox.send_now(Report(kind=BENCH_DONE, uuid="u-1", rate=20.0))
    assert manager.paths() == ["/param-done", "/bench-done"]
    assert done.passed is False


async def test_send_now_gives_up_at_its_deadline_and_keeps_the_report(tmp_path, manager):
    path = tmp_path / "state.json"
    manager.fail("/bench-done", *([503] * 1000))
    report = Report(kind=BENCH_DONE, uuid="u-1", rate=60.0)
    clock = TickingClock(manager, 10.0)
    retry = dataclasses.replace(FAST, report_stop_s=1000.0)
    async with manager.client(clock=clock, retry=retry) as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(ManagerUnavailable):
            await outbox.send_now(report, deadline_s=25.0)
        assert manager.paths() == ["/bench-done"] * 3  # the deadline, on the client's clock
        assert [r.id for r in StateStore(path).load().outbox] == [report.id]
        # Trying again with the same report does not queue it twice.
        manager.steps["/bench-done"].clear()
        manager.requests.clear()
        done = await outbox.send_now(report)
    assert done.passed is True
    assert manager.paths() == ["/bench-done"]
    assert outbox.pending == ()


async def test_instance_gone_is_raised_and_recorded(tmp_path, manager):
    path = tmp_path / "state.json"
    manager.fail("/running", (404, GONE["/running"]))
    report = Report(kind=RUNNING, uuid="u-1")
    async with manager.client() as client:
        _, outbox = open_outbox(path, client)
        with pytest.raises(InstanceGone):
            await outbox.send_now(report)
        # Asked again (e.g. after a restart): the recorded answer, no new request.
        with pytest.raises(InstanceGone):
            await outbox.send_now(report)
    assert len(manager.requests) == 1
    on_disk = StateStore(path).load()
    assert on_disk.outbox == ()
    assert on_disk.acked[-1].outcome == OUTCOME_GONE


async def test_a_rejected_report_is_dropped_and_the_next_one_still_goes(tmp_path, manager):
    manager.fail("/param-done", (400, {"error": "bad json"}))
    async with manager.client() as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        await outbox.enqueue(Report(kind=PARAM_DONE, uuid="u-1"))
        await outbox.enqueue(Report(kind=RUNNING, uuid="u-1"))
        with capture_logs() as logs:
            result = await outbox.drain()
    assert [r.outcome for r in result.sent] == [OUTCOME_REJECTED, OUTCOME_OK]
    assert manager.paths() == ["/param-done", "/running"]
    assert any(e["event"] == "manager.report_rejected" for e in logs)


async def test_a_report_that_cannot_be_written_is_not_sent(tmp_path, manager):
    blocker = tmp_path / "file"
    blocker.write_text("")
    async with manager.client() as client:
        keeper = StateKeeper(StateStore(blocker / "state.json"))
        outbox = Outbox.for_keeper(client, keeper)
        with pytest.raises(StateWriteError):
            await outbox.send_now(Report(kind=PARAM_DONE, uuid="u-1"))
    assert manager.requests == []
    assert outbox.pending == ()


async def test_acked_reports_are_bounded(tmp_path, manager):
    async with manager.client() as client:
        keeper, outbox = open_outbox(tmp_path / "state.json", client)
        for _ in range(20):
            await outbox.send_now(Report(kind=RUNNING, uuid="u-1"))
    assert len(outbox.acked) == 8
    assert len(keeper.state.acked) == 8


async def test_without_a_manager_the_outbox_completes_locally(tmp_path):
    async with ManagerClient(None) as client:
        _, outbox = open_outbox(tmp_path / "state.json", client)
        with capture_logs() as logs:
            done = await outbox.send_now(Report(kind=BENCH_DONE, uuid="local-C.1", rate=1.0))
    assert done.passed is True
    assert any(e["event"] == "manager.report_skipped" for e in logs)


async def test_a_json_answer_that_is_not_ok_true_is_not_an_applied_report(manager):
    # A proxy's own JSON (or {"ok": false}) is not the manager applying /running.
    manager.fail("/running", (200, {"status": "maintenance"}), (200, {"ok": False}))
    async with manager.client() as client:
        await client.running("u-1")
    assert manager.paths() == ["/running"] * 3
