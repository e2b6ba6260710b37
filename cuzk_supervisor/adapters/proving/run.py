"""One proof's submit/await loop: submit, then short awaits; await again after a cut,
resubmit (the same ``request_id``) only on NOT_FOUND, and once; a submit whose fate is unknown is
awaited before anything is submitted again.

:class:`ProofRun` is the state of one ``ProvingClient.prove``: its counters, its clock and the
loop. Its calls go through ``ProvingClient.call``, which watches them for a dead connection; its
retries are the values of :mod:`cuzk_supervisor.adapters.proving.policy`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import grpc
import structlog

from cuzk_supervisor.adapters.proving.errors import (
    OutOfBudget,
    ServerTimedOut,
    describe,
    is_connect_failure,
    is_cut,
)
from cuzk_supervisor.adapters.proving.policy import Attempt, await_policy, log_retry, submit_policy
from cuzk_supervisor.adapters.proving.results import DaemonTimings, ProofResult, ProofStatus
from cuzk_supervisor.adapters.proving.timeouts import ProvingTimeouts
from cuzk_supervisor.proto import proving_pb2 as pb

log = structlog.get_logger("supervisor.proving")


class Caller(Protocol):
    """What a proof's loop needs of the client (``client.ProvingClient``): its deadlines and its
    watched unary call. Named here so that the client imports the loop and not both ways."""

    timeouts: ProvingTimeouts

    async def call(
        self,
        method: str,
        request: Any,
        *,
        timeout: float,  # noqa: ASYNC109 - a gRPC deadline (it goes out as grpc-timeout)
        wait_for_ready: bool | None = None,
    ) -> Any: ...


class ProofRun:
    """The state of one :meth:`ProvingClient.prove`: counters, clock and the submit/await loop."""

    def __init__(self, client: Caller, request: pb.SubmitProofRequest, budget: float) -> None:
        self.client = client
        self.request = request
        self.job_id = request.request_id
        self.budget = budget
        self.t = client.timeouts
        self.started = time.monotonic()
        self.deadline = self.started + budget
        self.submissions = 0
        self.uploads_cut = 0
        self.submit_cut = False  # the last submit whose fate is unknown was cut (not dropped)
        self.landed_at: float | None = None
        self.sent_at: float | None = None
        self.attempt_started = 0.0
        self.await_attempts = 0
        self.attempt = Attempt()
        self.last_call = "SubmitProof"
        self.last_error = ""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def run(self) -> ProofResult:
        try:
            return await self._run()
        except OutOfBudget:
            return self._budget_exhausted()
        except grpc.aio.AioRpcError as exc:
            self.last_error = describe(exc)
            if await_policy(self.t).is_transient(exc) or submit_policy(self.t).is_transient(exc):
                # tenacity stopped retrying a transient error: its only stop is the budget.
                return self._budget_exhausted()
            return self._finish(
                ProofStatus.REJECTED, error=f"{self.last_call} failed: {self.last_error}"
            )

    async def _run(self) -> ProofResult:
        confirmed = await self._submit()
        resubmits_left = 1
        while True:
            try:
                response = await self._await()
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                if not confirmed:
                    # The submit's fate was unknown and the daemon does not know the job: it did
                    # not land. Submitting now is the first real submission, not a resubmission.
                    # A *cut* submit (the daemon alive, its deadline or ours) is then one the
                    # daemon never saw; a dropped connection may have taken a daemon, and the
                    # job it had, with it: that one stays counted.
                    if self.submit_cut:
                        self.submissions -= 1
                        self.uploads_cut += 1
                    self.landed_at = self.sent_at = None
                    log.info(
                        "proof.submit_not_landed", job_id=self.job_id, uploads_cut=self.uploads_cut
                    )
                    confirmed = await self._submit()
                    continue
                if resubmits_left == 0:
                    return self._finish(
                        ProofStatus.LOST,
                        error="daemon lost the job again after one resubmission (NOT_FOUND twice)",
                    )
                resubmits_left -= 1
                log.warning(
                    "proof.resubmitted", job_id=self.job_id, attempt=self.submissions + 1,
                    reason="AwaitProof NOT_FOUND: the daemon lost the job (restart?)",
                )  # fmt: skip
                confirmed = await self._submit()
                continue
            return self._from_response(response)

    async def _submit(self) -> bool:
        """Submit; True if the daemon accepted it, False if we cannot know whether it landed."""
        policy = submit_policy(self.t)

        async def once() -> pb.SubmitProofResponse:
            timeout = min(self.t.submit_deadline_s, self.remaining())
            if timeout <= 0:
                raise OutOfBudget()
            self.submissions += 1
            self.last_call = "SubmitProof"
            self.attempt_started = time.monotonic()
            try:
                return await self.client.call("SubmitProof", self.request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                self.last_error = describe(exc)
                if is_connect_failure(exc):
                    self.submissions -= 1  # nothing reached the daemon
                raise

        retrying = policy.retrying(
            self.remaining(), log_retry("proof.submit_retry", job_id=self.job_id)
        )
        try:
            response: pb.SubmitProofResponse = await retrying(once)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if not policy.fate_unknown(exc):
                raise
            self.submit_cut = is_cut(exc)
            # If the await then finds the job, this attempt carried it: the daemon had it by now.
            self.landed_at, self.sent_at = time.monotonic(), self.attempt_started
            log.warning("proof.submit_uncertain", job_id=self.job_id, attempt=self.submissions,
                        code=code.name, reason=describe(exc),
                        action="await the job first; NOT_FOUND means it did not land")  # fmt: skip
            return False
        self.landed_at, self.sent_at = time.monotonic(), self.attempt_started
        if response.job_id and response.job_id != self.job_id:
            # The daemon names the job after the request id; follow it if it ever differs.
            self.job_id = response.job_id
        log.info("proof.submitted", job_id=self.job_id, attempt=self.submissions,
                 queue_position=response.queue_position, assigned_gpu=response.assigned_gpu,
                 input_bytes=self.request.ByteSize())  # fmt: skip
        return True

    async def _await(self) -> pb.AwaitProofResponse:
        policy = await_policy(self.t)

        async def once() -> pb.AwaitProofResponse:
            timeout = min(self.t.await_deadline_s, self.remaining())
            if timeout <= 0:
                raise OutOfBudget()
            self.await_attempts += 1
            self.last_call = "AwaitProof"
            self.attempt.begin(timeout)
            try:
                response: pb.AwaitProofResponse = await self.client.call(
                    "AwaitProof",
                    # timeout_ms is set for servers that honour it; the real one ignores it, so
                    # our own call deadline is what bounds the call.
                    pb.AwaitProofRequest(job_id=self.job_id, timeout_ms=int(timeout * 1000)),
                    timeout=timeout,
                )
            except grpc.aio.AioRpcError as exc:
                self.last_error = describe(exc)
                raise
            if response.status == pb.AwaitProofResponse.TIMEOUT:
                self.last_error = describe(ServerTimedOut())
                raise ServerTimedOut()
            return response

        retrying = policy.retrying(
            self.remaining(), log_retry("proof.await_retry", job_id=self.job_id), self.attempt
        )
        try:
            return await retrying(once)
        except ServerTimedOut:
            raise OutOfBudget() from None

    def _from_response(self, response: pb.AwaitProofResponse) -> ProofResult:
        timings = DaemonTimings.of(response)
        if response.status == pb.AwaitProofResponse.COMPLETED:
            return self._finish(ProofStatus.COMPLETED, proof=response.proof, timings=timings)
        name = pb.AwaitProofResponse.Status.Name(response.status)
        message = response.error_message or "(no message)"
        return self._finish(ProofStatus.FAILED, error=f"{name}: {message}", timings=timings)

    def _budget_exhausted(self) -> ProofResult:
        elapsed = time.monotonic() - self.started
        last = f"; last error: {self.last_error}" if self.last_error else ""
        return self._finish(
            ProofStatus.BUDGET_EXHAUSTED,
            error=f"budget exhausted after {elapsed:.1f} s (budget {self.budget:g} s){last}",
        )

    def _finish(
        self,
        status: ProofStatus,
        *,
        error: str = "",
        proof: bytes = b"",
        timings: DaemonTimings | None = None,
    ) -> ProofResult:
        result = ProofResult(
            job_id=self.job_id,
            status=status,
            started_at=self.started,
            finished_at=time.monotonic(),
            error=error,
            proof=proof,
            timings=timings if timings is not None else DaemonTimings(),
            submissions=self.submissions,
            await_attempts=self.await_attempts,
            uploads_cut=self.uploads_cut,
            landed_at=self.landed_at,
            sent_at=self.sent_at,
        )
        fields = {
            "job_id": result.job_id,
            "wall_s": round(result.wall_s, 3),
            "submissions": result.submissions,
            "uploads_cut": result.uploads_cut,
            "await_attempts": result.await_attempts,
        }
        if result.ok:
            log.info("proof.completed", **fields, proof_len=result.proof_len,
                     total_ms=result.timings.total_ms)  # fmt: skip
        else:
            log.warning("proof.failed", **fields, status=str(status), error=error)
        return result
