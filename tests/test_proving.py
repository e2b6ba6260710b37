"""The proving client against an in-process fake daemon (tests/fakedaemon.py).

Timeouts are shrunk (an await deadline of 0.1 s instead of 30 s) so that the cases of the field
(a proof ten times longer than the await deadline, dropped awaits, a daemon that lost the job)
run in well under a second each.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest
import structlog
from fakedaemon import PROOF, Behaviour, FakeDaemon, free_port
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.adapters.proving.batch import run_batch
from cuzk_supervisor.adapters.proving.channel import MAX_MESSAGE_BYTES, channel_options
from cuzk_supervisor.adapters.proving.client import RECONNECT_AFTER_CUTS, ProvingClient
from cuzk_supervisor.adapters.proving.errors import (
    CUT_CODES,
    DaemonCallError,
    DaemonNotReady,
    is_cut,
    is_own_cancel,
)
from cuzk_supervisor.adapters.proving.policy import (
    ProvingTimeouts,
    await_policy,
    call_policy,
    ready_policy,
    submit_policy,
)
from cuzk_supervisor.adapters.proving.results import ProofStatus, summarize_batch
from cuzk_supervisor.address import Address
from cuzk_supervisor.core.bench import proofs_per_hour
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.serve.metrics import SupervisorMetrics

FAST = ProvingTimeouts(
    submit_deadline_s=2.0,
    await_deadline_s=0.1,
    proof_budget_s=10.0,
    call_deadline_s=1.0,
    ready_poll_interval_s=0.25,
    ready_poll_max_s=0.5,
    startup_deadline_s=2.0,
    backoff_base_s=0.01,
    backoff_max_s=0.05,
)


@contextlib.contextmanager
def watch_logs(event: str) -> Iterator[tuple[list[dict], asyncio.Event]]:
    """Capture structlog events; the asyncio.Event is set when ``event`` is logged."""
    entries: list[dict] = []
    seen = asyncio.Event()

    def processor(logger, method, event_dict):
        entries.append(dict(event_dict))
        if event_dict.get("event") == event:
            seen.set()
        raise structlog.DropEvent

    old = structlog.get_config()["processors"]
    structlog.configure(processors=[processor])
    try:
        yield entries, seen
    finally:
        structlog.configure(processors=old)


def porep(size: int = 1024, request_id: str = "") -> pb.SubmitProofRequest:
    return pb.SubmitProofRequest(
        request_id=request_id,
        proof_kind=pb.POREP_SEAL_COMMIT,
        sector_size=32 * 1024**3,
        vanilla_proof=b"x" * size,
        sector_number=1,
        miner_id=1000,
    )


async def prove_once(
    behaviour: Behaviour,
    timeouts: ProvingTimeouts = FAST,
    request: pb.SubmitProofRequest | None = None,
    budget_s: float | None = None,
):
    async with FakeDaemon(behaviour) as fake, ProvingClient(fake.address, timeouts) as client:
        result = await client.prove(request if request is not None else porep(), budget_s)
    return fake, result


# --- prove ------------------------------------------------------------------------------------


async def test_proof_ten_times_longer_than_await_deadline_completes_with_one_submission():
    fake, result = await prove_once(Behaviour(proof_s=10 * FAST.await_deadline_s))
    assert result.ok, result.error
    assert result.proof == PROOF
    assert fake.submit_calls == [result.job_id]
    assert result.submissions == 1
    # The short deadline really cut the awaits: several calls, the same job each time.
    assert result.await_attempts >= 5
    assert set(fake.await_calls) == {result.job_id}
    assert result.timings.total_ms >= 900


async def test_await_sets_timeout_ms_to_its_own_deadline():
    fake, result = await prove_once(Behaviour(proof_s=0.3))
    assert result.ok
    assert fake.await_timeout_ms
    assert all(0 < ms <= 100 for ms in fake.await_timeout_ms)


async def test_unavailable_during_awaits_reawaits_the_same_job_without_resubmitting():
    fake, result = await prove_once(Behaviour(proof_s=0.2, await_unavailable=3))
    assert result.ok, result.error
    assert fake.submit_calls == [result.job_id]
    assert result.submissions == 1
    assert result.await_attempts >= 4
    assert set(fake.await_calls) == {result.job_id}


async def test_not_found_resubmits_once_with_the_same_request_id_and_completes():
    fake, result = await prove_once(Behaviour(proof_s=0.2, lose_job_on_await=1))
    assert result.ok, result.error
    assert fake.submit_calls == [result.job_id, result.job_id]
    assert result.submissions == 2


async def test_second_not_found_after_resubmission_is_a_failure():
    fake, result = await prove_once(Behaviour(proof_s=0.2, lose_job_on_await=2))
    assert not result.ok
    assert result.status is ProofStatus.LOST
    assert "NOT_FOUND" in result.error
    assert fake.submit_calls == [result.job_id, result.job_id]
    assert fake.completed == []


async def test_failed_proof_is_returned_with_the_daemons_message_and_not_retried():
    fake, result = await prove_once(Behaviour(proof_s=0.05, fail_message="partition 3 failed"))
    assert not result.ok
    assert result.status is ProofStatus.FAILED
    assert "partition 3 failed" in result.error
    assert fake.submit_calls == [result.job_id]
    assert result.submissions == 1


async def test_budget_exhaustion_is_a_failed_result_with_a_reason_before_the_proof_ends():
    # The proof takes a minute: a result before then is the budget's (an ignored budget would
    # wait for the proof and return it completed).
    fake, result = await prove_once(Behaviour(proof_s=60.0), budget_s=0.5)
    assert result.status is ProofStatus.BUDGET_EXHAUSTED
    assert "budget exhausted after" in result.error
    assert "DEADLINE_EXCEEDED" in result.error
    assert fake.submit_calls == [result.job_id]


async def test_submit_that_never_landed_is_awaited_first_then_submitted_again():
    timeouts = replace(FAST, submit_deadline_s=0.3)
    fake, result = await prove_once(Behaviour(proof_s=0.1, submit_hang=1), timeouts)
    assert result.ok, result.error
    # The first submit's deadline passed; the await said NOT_FOUND; one real job was proven.
    assert fake.submit_calls == [result.job_id, result.job_id]
    assert fake.enqueued == [result.job_id]
    assert fake.await_calls[0] == result.job_id
    # What the daemon saw: one submission; the cut upload is reported apart.
    assert (result.submissions, result.uploads_cut) == (1, 1)
    assert result.to_dict()["uploads_cut"] == 1


async def test_submit_that_landed_but_lost_its_answer_is_not_submitted_again():
    timeouts = replace(FAST, submit_deadline_s=0.3)
    fake, result = await prove_once(Behaviour(proof_s=0.2, submit_ack_hang=1), timeouts)
    assert result.ok, result.error
    assert fake.submit_calls == [result.job_id]
    assert fake.enqueued == [result.job_id]
    assert result.submissions == 1
    assert result.uploads_cut == 0


async def test_a_lost_submit_answer_bounds_the_landing_by_the_cut_attempts_end():
    """The daemon had the job by the time the submit that carried it was cut, so its
    ``total_ms`` counts from then at the latest (benchrun.completed_at), not from when the
    result was heard."""
    timeouts = replace(FAST, submit_deadline_s=0.3)
    _, result = await prove_once(Behaviour(proof_s=0.2, submit_ack_hang=1), timeouts)
    assert result.ok, result.error
    assert result.landed_at is not None
    assert result.started_at + 0.3 <= result.landed_at < result.finished_at
    # It went in with that attempt, which began with the proof.
    assert result.sent_at is not None
    assert result.started_at <= result.sent_at < result.started_at + 0.3


async def test_a_submit_made_again_went_in_when_its_second_attempt_began():
    """The first upload never landed: the proof went in with the second attempt, begun after
    the first was cut (the bench judges its lateness from then: benchrun, Stretch.landed)."""
    timeouts = replace(FAST, submit_deadline_s=0.3)
    _, result = await prove_once(Behaviour(proof_s=0.1, submit_hang=1), timeouts)
    assert result.ok, result.error
    assert result.sent_at is not None
    assert result.landed_at is not None
    assert result.started_at + 0.3 <= result.sent_at <= result.landed_at


async def test_rejected_submit_is_a_failure_without_retry():
    fake, result = await prove_once(Behaviour(submit_reject=1))
    assert result.status is ProofStatus.REJECTED
    assert "SubmitProof failed: INVALID_ARGUMENT" in result.error
    assert len(fake.submit_calls) == 1
    assert result.await_attempts == 0


async def test_submit_retries_while_the_daemon_refuses_connections_then_submits_once():
    port = free_port()
    fake = FakeDaemon(Behaviour(proof_s=0.05))
    with watch_logs("proof.submit_retry") as (logs, retried):
        async with ProvingClient(Address(host="127.0.0.1", port=port), FAST) as client:
            task = asyncio.create_task(client.prove(porep()))
            async with asyncio.timeout(5):
                await retried.wait()  # the client saw the refused connection at least once
            await fake.start(port)
            try:
                result = await task
            finally:
                await fake.stop()
    assert result.ok, result.error
    assert fake.submit_calls == [result.job_id]
    assert result.submissions == 1
    retries = [e for e in logs if e["event"] == "proof.submit_retry"]
    assert retries[0]["attempt"] == 1
    assert retries[0]["code"] == "UNAVAILABLE"
    assert retries[0]["job_id"] == result.job_id


async def test_request_id_is_set_when_missing_and_the_callers_request_is_not_changed():
    request = porep()
    fake, result = await prove_once(Behaviour(), request=request)
    assert request.request_id == ""
    assert str(uuid.UUID(result.job_id)) == result.job_id
    assert fake.submit_calls == [result.job_id]


async def test_given_request_id_is_the_job_id():
    fake, result = await prove_once(Behaviour(), request=porep(request_id="job-7"))
    assert result.job_id == "job-7"
    assert fake.await_calls == ["job-7"]


async def test_sixty_megabyte_input_is_accepted_end_to_end():
    size = 60 * 1000 * 1000
    timeouts = replace(FAST, submit_deadline_s=15.0)
    fake, result = await prove_once(Behaviour(), timeouts, request=porep(size=size))
    assert result.ok, result.error
    assert fake.input_sizes == [size]


async def test_prove_over_a_unix_socket(tmp_path):
    async with (
        FakeDaemon(Behaviour(proof_s=0.05), unix_path=tmp_path / "cuzk.sock") as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        assert fake.address.is_unix
        result = await client.prove(porep())
    assert result.ok, result.error


async def test_events_are_logged_with_job_id_and_attempt():
    with watch_logs("proof.completed") as (logs, _):
        _, result = await prove_once(Behaviour(proof_s=0.2, await_unavailable=1))
    submitted = [e for e in logs if e["event"] == "proof.submitted"]
    assert [(e["job_id"], e["attempt"]) for e in submitted] == [(result.job_id, 1)]
    retries = [e for e in logs if e["event"] == "proof.await_retry"]
    assert retries[0]["code"] == "UNAVAILABLE"
    assert retries[0]["attempt"] == 1
    assert all(e["job_id"] == result.job_id for e in retries)
    # The later retries are our own deadline cutting the long await: re-awaited at once.
    assert {e["code"] for e in retries[1:]} <= {"DEADLINE_EXCEEDED"}
    assert all(e["sleep_s"] == 0 for e in retries[1:])
    assert [e["job_id"] for e in logs if e["event"] == "proof.completed"] == [result.job_id]


# --- readiness, status, metrics --------------------------------------------------------------


async def test_wait_ready_against_nothing_fails_after_its_deadline_naming_the_address():
    address = Address(host="127.0.0.1", port=free_port())
    deadline = 1.0
    started = time.monotonic()
    async with ProvingClient(address, FAST) as client:
        with pytest.raises(DaemonNotReady) as caught:
            await client.wait_ready(deadline)
    elapsed = time.monotonic() - started
    assert str(address) in str(caught.value)
    assert "nothing listening" in str(caught.value)
    # Not a margin: it waited out its deadline before giving up (one poll interval may be left
    # unused); a slow machine only waits longer. How far past it is not asserted: it stopped
    # polling at the deadline (an ignored deadline would poll until the test's timeout).
    assert elapsed >= deadline - FAST.ready_poll_max_s
    assert caught.value.calls <= deadline / FAST.ready_poll_interval_s + 1


async def test_wait_ready_makes_no_more_than_a_few_calls_per_second():
    deadline = 1.5
    async with (
        FakeDaemon(Behaviour(status_unavailable=10_000)) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        with pytest.raises(DaemonNotReady, match=str(fake.address)):
            await client.wait_ready(deadline)
    times = fake.status_call_times
    assert 2 <= len(times) <= deadline / FAST.ready_poll_interval_s + 1
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= FAST.ready_poll_interval_s * 0.9  # a lower bound: slow only adds


async def test_wait_ready_returns_the_status_once_the_daemon_answers():
    async with (
        FakeDaemon(Behaviour(status_unavailable=2)) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        status = await client.wait_ready(5.0)
    assert status.gpus[0].name == "Fake GPU"
    assert len(fake.status_call_times) == 3


async def test_status_and_metrics_helpers():
    async with (
        FakeDaemon(Behaviour(metrics_text="cuzk_uptime_seconds 1\n")) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        assert (await client.status()).uptime_seconds == 1
        assert await client.metrics() == "cuzk_uptime_seconds 1\n"


async def test_status_against_nothing_raises_daemon_call_error():
    address = Address(host="127.0.0.1", port=free_port())
    async with ProvingClient(address, FAST) as client:
        with pytest.raises(DaemonCallError, match="GetStatus") as caught:
            await client.status()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE


# --- batches ----------------------------------------------------------------------------------


async def test_batch_of_six_at_concurrency_two_never_has_more_than_two_in_flight():
    seen: list[int] = []
    async with (
        FakeDaemon(Behaviour(proof_s=0.15)) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        batch = await run_batch(
            client, porep(request_id="template"), 6, 2, on_result=lambda i, r: seen.append(i)
        )
    assert fake.max_running == 2
    assert len(fake.enqueued) == 6
    assert len(set(fake.enqueued)) == 6
    assert "template" not in fake.enqueued
    assert sorted(seen) == list(range(6))
    assert sorted(r.job_id for r in batch.results) == sorted(fake.enqueued)
    summary = batch.summary
    assert (summary.count, summary.completed, summary.failed) == (6, 6, 0)
    first = min(r.started_at for r in batch.results)
    last = max(r.finished_at for r in batch.results)
    assert summary.wall_s == pytest.approx(last - first)
    assert summary.proofs_per_hour == pytest.approx(6 / summary.wall_s * 3600)


async def test_batch_counts_failures():
    async with (
        FakeDaemon(Behaviour(fail_message="boom")) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        batch = await run_batch(client, porep(), 3, 3)
    assert (batch.summary.completed, batch.summary.failed) == (0, 3)
    assert batch.summary.proofs_per_hour == 0.0


async def test_batch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="count"):
        await run_batch(None, porep(), 0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency"):
        await run_batch(None, porep(), 1, 0)  # type: ignore[arg-type]


# --- pure parts -------------------------------------------------------------------------------


def test_proofs_per_hour_examples():
    assert proofs_per_hour(12, 3600.0) == 12.0
    assert proofs_per_hour(6, 360.0) == 60.0
    assert proofs_per_hour(0, 100.0) == 0.0
    assert proofs_per_hour(5, 0.0) == 0.0


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=1e-3, max_value=1e6))
def test_proofs_per_hour_is_completed_over_wall_times_3600(completed, wall_s):
    rate = proofs_per_hour(completed, wall_s)
    assert rate == pytest.approx(completed / wall_s * 3600)
    assert rate > 0


def test_summarize_empty_batch():
    summary = summarize_batch([], 2)
    assert (summary.count, summary.completed, summary.wall_s, summary.proofs_per_hour) == (
        0,
        0,
        0.0,
        0.0,
    )


def test_channel_options_raise_message_limits_and_keep_keepalive_polite():
    options = dict(channel_options())
    # A replaced channel must dial its own connection, never share the old (frozen) one.
    assert options["grpc.use_local_subchannel_pool"] == 1
    assert options["grpc.max_send_message_length"] >= 256 * 1024 * 1024
    assert options["grpc.max_receive_message_length"] >= 256 * 1024 * 1024
    assert MAX_MESSAGE_BYTES >= 256 * 1024 * 1024
    assert options["grpc.keepalive_time_ms"] >= 5 * 60 * 1000
    assert options["grpc.keepalive_permit_without_calls"] == 0


def test_retry_policies_are_printable_comparable_values():
    assert await_policy(FAST) == await_policy(FAST)
    assert await_policy(FAST) != submit_policy(FAST)
    assert "UNAVAILABLE" in repr(submit_policy(FAST))
    assert submit_policy(FAST).before_send_only
    assert grpc.StatusCode.NOT_FOUND not in await_policy(FAST).codes
    assert ready_policy(FAST).min_s >= 0.25
    # A cut call is a cut call, whoever cut it: positive lists that name CANCELLED.
    assert {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED} == CUT_CODES
    assert await_policy(FAST).codes >= CUT_CODES
    assert ready_policy(FAST).codes >= CUT_CODES
    assert grpc.StatusCode.CANCELLED in submit_policy(FAST).unknown_fate
    assert call_policy(FAST).codes == {grpc.StatusCode.CANCELLED}
    assert call_policy(FAST).max_attempts == 2
    assert "CANCELLED" in repr(await_policy(FAST))


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("code", "details", "cut", "transient", "fate_unknown"),
    [
        (grpc.StatusCode.CANCELLED, "Timeout expired", True, True, True),  # tonic
        (grpc.StatusCode.CANCELLED, "Stream removed", True, True, True),  # grpc-go's RST
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", True, True, True),
        (grpc.StatusCode.CANCELLED, "Locally cancelled by application!", False, False, False),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", False, True, True),
        (grpc.StatusCode.NOT_FOUND, "job not found: x", False, False, False),
    ],
)
def test_which_errors_are_cuts_and_what_each_policy_does_with_them(
    code, details, cut, transient, fate_unknown
):
    exc = rpc_error(code, details)
    assert is_cut(exc) is cut
    assert await_policy(FAST).is_transient(exc) is transient
    assert submit_policy(FAST).fate_unknown(exc) is fate_unknown
    assert is_own_cancel(exc) is ("Locally" in details)


async def test_a_channel_cut_twice_with_nothing_received_is_replaced_and_the_proof_completes():
    reconnects: list[int] = []
    metrics = SupervisorMetrics()

    def on_reconnect() -> None:
        reconnects.append(1)
        metrics.grpc_reconnect()

    with watch_logs("proving.reconnect") as (logs, reconnected):
        async with (
            FakeDaemon(Behaviour(proof_s=8 * FAST.await_deadline_s)) as fake,
            ProvingClient(fake.address, FAST, on_reconnect=on_reconnect) as client,
        ):
            first_stub = client.stub
            result = await client.prove(porep())
            assert client.stub is not first_stub
    assert result.ok, result.error
    assert fake.submit_calls == [result.job_id]
    assert reconnected.is_set()
    # One reconnect per RECONNECT_AFTER_CUTS awaits cut by our own deadline (the fake never cuts).
    cut_awaits = result.await_attempts - 1
    assert len(reconnects) == client.reconnects == cut_awaits // RECONNECT_AFTER_CUTS
    event = next(e for e in logs if e["event"] == "proving.reconnect")
    assert "cut with nothing received" in event["reason"]
    # Counted in the supervisor's /metrics.
    assert f"cuzk_supervisor_grpc_reconnects_total {float(len(reconnects))}" in (
        metrics.render().decode()
    )


async def test_an_answered_call_resets_the_cut_count():
    async with (
        FakeDaemon(Behaviour(proof_s=5.0)) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError):
                await client.call(
                    "AwaitProof", pb.AwaitProofRequest(job_id="none"), timeout=0.05
                )  # NOT_FOUND: an answer
        assert client.reconnects == 0
        await client.call("SubmitProof", porep(request_id="slow"), timeout=2)
        for _ in range(RECONNECT_AFTER_CUTS):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.call("AwaitProof", pb.AwaitProofRequest(job_id="slow"), timeout=0.05)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert client.reconnects == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ready_poll_interval_s", 0.1),
        ("await_deadline_s", 0.0),
        ("proof_budget_s", -1.0),
        ("backoff_max_s", 0.001),
    ],
)
def test_timeouts_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        replace(ProvingTimeouts(), **{field: value})


async def test_a_replacement_channel_dials_at_once_not_at_its_first_call():
    async with (
        FakeDaemon(Behaviour(proof_s=5.0)) as fake,
        ProvingClient(fake.address, FAST) as client,
    ):
        job = await client.call("SubmitProof", porep(), timeout=5)
        first_stub = client.stub
        request = pb.AwaitProofRequest(job_id=job.job_id)
        for _ in range(RECONNECT_AFTER_CUTS):
            with pytest.raises(grpc.aio.AioRpcError):
                await client.call("AwaitProof", request, timeout=0.05)
        assert client.stub is not first_stub
        # Connecting (or connected) before anything was sent on it: the submission that follows
        # does not wait for the dial. Left idle, a channel would stay so until its first call.
        channel = client._current().channel
        if channel.get_state() is grpc.ChannelConnectivity.IDLE:
            await asyncio.wait_for(
                channel.wait_for_state_change(grpc.ChannelConnectivity.IDLE), timeout=10
            )
        assert channel.get_state() is not grpc.ChannelConnectivity.IDLE
