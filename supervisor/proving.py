"""Async gRPC client for the cuzk proving daemon: submit, then short awaits, retried on purpose.

The rules (DESIGN.md principles 4 and 5, incidents I1 and I3):

- No long RPC. A proof is one ``SubmitProof`` (returns at once) and then ``AwaitProof`` calls, each
  cut by *our* short deadline: the real server ignores ``timeout_ms`` and would hold the call for
  the whole proof, and a long call is what broke in the field.
- The server does not de-duplicate ``request_id``. A cut or dropped await means "await the same
  job again", never "submit again". Resubmit, with the same ``request_id``, only on NOT_FOUND
  (the daemon restarted and lost the job), once; a second loss is a failure.
- A submit whose fate is unknown (its deadline passed, or the connection dropped under it) is
  never retried blind: the job is awaited first, and NOT_FOUND then means "it did not land".
  A submit is retried directly only when the channel could not connect at all, i.e. nothing was
  sent.
- Every retry goes through tenacity with a :class:`RetryPolicy` value: only codes known to be
  transient, jittered exponential backoff, a stop at the remaining budget, each attempt logged.
- Failures are values: :meth:`ProvingClient.prove` returns a :class:`ProofResult` for a failed,
  lost or out-of-budget proof; it raises only for cancellation and programming errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Protocol, Self

import grpc
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from supervisor.address import Address
from supervisor.policy import proofs_per_hour
from supervisor.proto import proving_pb2 as pb
from supervisor.proto import proving_pb2_grpc as pb_grpc

log = structlog.get_logger("supervisor.proving")

MIB = 1024 * 1024
# The daemon's own limit is 128 MiB each way; a PoRep input is ~51 MB and grpc-python's default
# receive limit is 4 MiB. Ours is higher than the server's so the server's is the one that counts.
MAX_MESSAGE_BYTES = 256 * MIB
# GetStatus runs nvidia-smi on the real daemon: never poll it faster than this.
MIN_READY_POLL_INTERVAL_S = 0.25
# grpc-core's message when a call failed because the channel could not connect: nothing was sent.
_CONNECT_FAILURE_MARK = "failed to connect to all addresses"


LISTEN_PROBE_INTERVAL_S = 0.025


async def _until_listening(address: Address, budget_s: float) -> bool:
    """True once a plain connect to ``address`` succeeds; False when ``budget_s`` has passed."""
    end = time.monotonic() + max(0.0, budget_s)
    while True:
        try:
            if address.path is not None:
                _, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(str(address.path)), LISTEN_PROBE_INTERVAL_S * 4
                )
            else:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(address.host, address.port),
                    LISTEN_PROBE_INTERVAL_S * 4,
                )
        except (OSError, TimeoutError):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(LISTEN_PROBE_INTERVAL_S)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


def channel_options() -> list[tuple[str, int]]:
    """grpc channel arguments for talking to the daemon (TCP or unix socket).

    Keepalive: a grpc-core server (default ``grpc.http2.min_ping_interval_without_data_ms`` of
    5 min, 2 strikes) answers pings that come more often with GOAWAY ``too_many_pings`` and drops
    every call on the connection; hyper/tonic servers also limit pings. So we ping rarely (6 min,
    above the 5 min floor with margin) and never on an idle connection (no pings without calls).
    Keepalive is only a backstop: our short per-call deadlines are what notice a dead daemon.

    Reconnect backoff: grpc-core's default grows to 120 s, so after a daemon restart the channel
    could sit in backoff long after the daemon answers. Capping it at 2 s keeps readiness
    detection close to the daemon's real start.
    """
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 360_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


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
        for name in (
            "submit_deadline_s",
            "await_deadline_s",
            "proof_budget_s",
            "call_deadline_s",
            "startup_deadline_s",
            "backoff_base_s",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.ready_poll_interval_s < MIN_READY_POLL_INTERVAL_S:
            raise ValueError(
                f"ready_poll_interval_s must be >= {MIN_READY_POLL_INTERVAL_S} s "
                f"(GetStatus runs nvidia-smi), got {self.ready_poll_interval_s!r}"
            )
        if self.ready_poll_max_s < self.ready_poll_interval_s:
            raise ValueError("ready_poll_max_s must be >= ready_poll_interval_s")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")


# --- errors -----------------------------------------------------------------------------------


class ProvingError(Exception):
    """Base of the errors this module raises (results of proofs are values, not errors)."""


class DaemonNotReady(ProvingError):
    """The daemon did not answer GetStatus within the startup deadline."""

    def __init__(self, address: Address, waited_s: float, calls: int, last_error: str) -> None:
        self.address = address
        self.waited_s = waited_s
        self.calls = calls
        self.last_error = last_error
        super().__init__(
            f"daemon at {address} not ready after {waited_s:.1f} s "
            f"({calls} GetStatus calls); last error: {last_error}"
        )


class DaemonCallError(ProvingError):
    """A short call (GetStatus, GetMetrics) failed."""

    def __init__(self, method: str, address: Address, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.address = address
        self.code = code
        self.details = details
        super().__init__(f"{method} to {address} failed: {code.name}: {details}")


class _ServerTimedOut(Exception):
    """AwaitProof answered with status TIMEOUT (a server that honours timeout_ms): await again."""


class _OutOfBudget(Exception):
    """No budget is left for another call."""


def _code_of(exc: BaseException) -> grpc.StatusCode | None:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, _ServerTimedOut):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, _ServerTimedOut):
        return "AwaitProof answered TIMEOUT"
    return f"{type(exc).__name__}: {exc}"


def is_connect_failure(exc: BaseException) -> bool:
    """True when a call failed because the channel could not connect: the server got nothing.

    grpc-core reports a refused connection or a missing unix socket as UNAVAILABLE with
    "failed to connect to all addresses". A connection dropped *during* a call (or a server that
    aborts with UNAVAILABLE) has other details: the request may have arrived.
    """
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.UNAVAILABLE
        and _CONNECT_FAILURE_MARK in (exc.details() or "")
    )


# --- retry policy -----------------------------------------------------------------------------


class _PolicyWait(wait_base):
    """Full-jitter exponential backoff, except no wait after our own deadline cut a call."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._immediate = policy.immediate
        self._backoff = wait_random_exponential(
            multiplier=policy.base_s, max=policy.max_s, min=policy.min_s
        )

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        # Only a real deadline (the call already waited its full length) skips the backoff; a
        # server answering TIMEOUT at once must not make us spin.
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in self._immediate:
            return 0.0
        return float(self._backoff(retry_state))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What one kind of call retries and how it waits: a value to print, compare and test.

    Only the listed status codes are retried; everything else ends the retrying at once.
    """

    name: str
    codes: frozenset[grpc.StatusCode]
    """Status codes known to be transient for this call."""
    base_s: float
    """Backoff scale: the n-th wait is uniform in [min_s, min(max_s, base_s * 2**(n-1))]."""
    max_s: float
    """Backoff cap."""
    min_s: float = 0.0
    """Least wait between two tries (rate-limits GetStatus)."""
    before_send_only: bool = False
    """Retry UNAVAILABLE only when the channel could not connect (nothing was sent)."""
    immediate: frozenset[grpc.StatusCode] = frozenset()
    """Codes retried without backoff: our own deadline cut the call, which already waited.
    (The backoff's attempt counter still counts them, so a later transport error waits up to
    ``max_s``.)"""

    def is_transient(self, exc: BaseException) -> bool:
        code = _code_of(exc)
        if code is None or code not in self.codes:
            return False
        if self.before_send_only and code == grpc.StatusCode.UNAVAILABLE:
            return is_connect_failure(exc)
        return True

    def retrying(
        self, budget_s: float, before_sleep: Callable[[RetryCallState], None]
    ) -> AsyncRetrying:
        """A tenacity controller for one series of attempts that must end within ``budget_s``."""
        return AsyncRetrying(
            retry=retry_if_exception(self.is_transient),
            wait=_PolicyWait(self),
            stop=stop_before_delay(max(budget_s, 0.0)),
            before_sleep=before_sleep,
            reraise=True,
        )


def submit_policy(t: ProvingTimeouts) -> RetryPolicy:
    """SubmitProof: retried only when nothing was sent (connection refused, no socket).

    Risk, noted on purpose: UNAVAILABLE from a connection dropped mid-upload, or a deadline,
    leaves us not knowing whether the job landed; those are not retried here but resolved by
    awaiting the job (NOT_FOUND = not submitted). A submit still being processed by the server
    when that await arrives could be proven twice; the window is the server's enqueue time.
    """
    return RetryPolicy(
        name="submit",
        codes=frozenset({grpc.StatusCode.UNAVAILABLE}),
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        before_send_only=True,
    )


def await_policy(t: ProvingTimeouts) -> RetryPolicy:
    """AwaitProof: a deadline (ours) or a transport error means "await the same job again"."""
    return RetryPolicy(
        name="await",
        codes=frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}),
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        immediate=frozenset({grpc.StatusCode.DEADLINE_EXCEEDED}),
    )


def ready_policy(t: ProvingTimeouts) -> RetryPolicy:
    """GetStatus while starting: not listening yet, or too slow to answer; never too often."""
    return RetryPolicy(
        name="ready",
        codes=frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}),
        base_s=t.ready_poll_interval_s,
        max_s=t.ready_poll_max_s,
        min_s=t.ready_poll_interval_s,
    )


def _log_retry(event: str, **context: Any) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        code = _code_of(exc) if exc is not None else None
        log.info(
            event,
            attempt=state.attempt_number,
            code=code.name if code is not None else None,
            reason=_describe(exc) if exc is not None else None,
            sleep_s=round(state.upcoming_sleep, 3),
            **context,
        )

    return before_sleep


# --- results ----------------------------------------------------------------------------------


class ProofStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    """The daemon ran the proof and reported it FAILED (or CANCELLED): never retried."""
    LOST = "lost"
    """The daemon lost the job again after one resubmission (NOT_FOUND twice)."""
    REJECTED = "rejected"
    """A call failed with a non-transient error (e.g. INVALID_ARGUMENT)."""
    BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True, slots=True)
class DaemonTimings:
    """The daemon's own figures. On the PoRep path synthesis and GPU times are sums over
    partitions (they can exceed wall time): compute rates from wall-clock time."""

    queue_wait_ms: int = 0
    srs_load_ms: int = 0
    synthesis_ms: int = 0
    gpu_compute_ms: int = 0
    total_ms: int = 0

    @classmethod
    def of(cls, response: pb.AwaitProofResponse) -> DaemonTimings:
        return cls(
            queue_wait_ms=response.queue_wait_ms,
            srs_load_ms=response.srs_load_ms,
            synthesis_ms=response.synthesis_ms,
            gpu_compute_ms=response.gpu_compute_ms,
            total_ms=response.total_ms,
        )


@dataclass(frozen=True, slots=True)
class ProofResult:
    """How one proof ended. ``started_at``/``finished_at`` are ``time.monotonic()`` stamps."""

    job_id: str
    status: ProofStatus
    started_at: float
    finished_at: float
    error: str = ""
    proof: bytes = field(default=b"", repr=False)
    timings: DaemonTimings = DaemonTimings()
    submissions: int = 0
    """SubmitProof calls that may have reached the daemon (refused connections not counted)."""
    await_attempts: int = 0
    """AwaitProof calls made."""

    @property
    def ok(self) -> bool:
        return self.status is ProofStatus.COMPLETED

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def proof_len(self) -> int:
        return len(self.proof)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the proof itself left out, its length kept)."""
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "status": str(self.status),
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "proof_len": self.proof_len,
            "submissions": self.submissions,
            "await_attempts": self.await_attempts,
            "queue_wait_ms": self.timings.queue_wait_ms,
            "srs_load_ms": self.timings.srs_load_ms,
            "synthesis_ms": self.timings.synthesis_ms,
            "gpu_compute_ms": self.timings.gpu_compute_ms,
            "total_ms": self.timings.total_ms,
        }


# --- the client -------------------------------------------------------------------------------


class ProvingClient:
    """Async client over one grpc.aio channel. Use as ``async with ProvingClient(...) as c``."""

    def __init__(self, address: Address, timeouts: ProvingTimeouts | None = None) -> None:
        self.address = address
        self.timeouts = timeouts if timeouts is not None else ProvingTimeouts()
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.ProvingEngineStub | None = None

    async def __aenter__(self) -> Self:
        self._channel = grpc.aio.insecure_channel(
            self.address.grpc_target(), options=channel_options()
        )
        self._stub = pb_grpc.ProvingEngineStub(self._channel)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close(grace=None)

    @property
    def stub(self) -> pb_grpc.ProvingEngineStub:
        if self._stub is None:
            raise RuntimeError("ProvingClient is not open: use `async with ProvingClient(...)`")
        return self._stub

    async def status(self) -> pb.GetStatusResponse:
        """One GetStatus call with the short deadline; raises DaemonCallError."""
        try:
            response: pb.GetStatusResponse = await self.stub.GetStatus(
                pb.GetStatusRequest(), timeout=self.timeouts.call_deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            raise DaemonCallError(
                "GetStatus", self.address, exc.code(), exc.details() or ""
            ) from exc
        return response

    async def metrics(self) -> str:
        """The daemon's Prometheus text (one GetMetrics call); raises DaemonCallError."""
        try:
            response: pb.GetMetricsResponse = await self.stub.GetMetrics(
                pb.GetMetricsRequest(), timeout=self.timeouts.call_deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            raise DaemonCallError(
                "GetMetrics", self.address, exc.code(), exc.details() or ""
            ) from exc
        return response.prometheus_text

    async def wait_ready(self, deadline_s: float | None = None) -> pb.GetStatusResponse:
        """Poll GetStatus until it answers; raise DaemonNotReady after ``deadline_s``.

        Calls are at least ``ready_poll_interval_s`` apart (the real daemon runs nvidia-smi for
        each), backing off to ``ready_poll_max_s``; each call is cut by ``call_deadline_s``.
        It gives up when the next poll would start past the deadline (tenacity's
        ``stop_before_delay``), so it can end up to one poll interval before ``deadline_s``.
        Only UNAVAILABLE and DEADLINE_EXCEEDED are retried; any other answer is raised as
        DaemonNotReady at once (e.g. UNIMPLEMENTED: not a cuzk daemon).
        """
        deadline = self.timeouts.startup_deadline_s if deadline_s is None else deadline_s
        policy = ready_policy(self.timeouts)
        started = time.monotonic()
        calls = 0

        async def once() -> pb.GetStatusResponse:
            nonlocal calls
            remaining = deadline - (time.monotonic() - started)
            # Wait for the port with plain connects (cheap; no nvidia-smi behind them), so the
            # first GetStatus goes out as soon as something listens.
            if not await _until_listening(self.address, remaining):
                raise DaemonNotReady(
                    self.address, time.monotonic() - started, calls, "nothing listening there"
                )
            remaining = deadline - (time.monotonic() - started)
            calls += 1
            response: pb.GetStatusResponse = await self.stub.GetStatus(
                pb.GetStatusRequest(),
                timeout=max(min(self.timeouts.call_deadline_s, remaining), 0.001),
                # A channel still in reconnect backoff waits to connect instead of failing.
                wait_for_ready=True,
            )
            return response

        retrying = policy.retrying(
            deadline, _log_retry("daemon.ready_retry", address=str(self.address))
        )
        try:
            response = await retrying(once)
        except grpc.aio.AioRpcError as exc:
            raise DaemonNotReady(
                self.address, time.monotonic() - started, calls, _describe(exc)
            ) from None
        log.info(
            "daemon.ready",
            address=str(self.address),
            calls=calls,
            waited_s=round(time.monotonic() - started, 3),
        )
        return response

    async def prove(
        self, request: pb.SubmitProofRequest, budget_s: float | None = None
    ) -> ProofResult:
        """Submit one proof and await its result within ``budget_s`` (default: the timeouts').

        The caller's request is not changed; if it has no ``request_id`` a copy gets a uuid4,
        and that id is the job id (the daemon uses the request id as job id).
        """
        budget = self.timeouts.proof_budget_s if budget_s is None else budget_s
        if not budget > 0:
            raise ValueError(f"budget_s must be > 0, got {budget!r}")
        if not request.request_id:
            copy = pb.SubmitProofRequest()
            copy.CopyFrom(request)
            copy.request_id = str(uuid.uuid4())
            request = copy
        return await _ProofRun(self, request, budget).run()


class _ProofRun:
    """The state of one :meth:`ProvingClient.prove`: counters, clock and the submit/await loop."""

    def __init__(
        self, client: ProvingClient, request: pb.SubmitProofRequest, budget: float
    ) -> None:
        self.client = client
        self.request = request
        self.job_id = request.request_id
        self.budget = budget
        self.t = client.timeouts
        self.started = time.monotonic()
        self.deadline = self.started + budget
        self.submissions = 0
        self.await_attempts = 0
        self.last_call = "SubmitProof"
        self.last_error = ""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def run(self) -> ProofResult:
        try:
            return await self._run()
        except _OutOfBudget:
            return self._budget_exhausted()
        except grpc.aio.AioRpcError as exc:
            self.last_error = _describe(exc)
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
                    log.info("proof.submit_not_landed", job_id=self.job_id)
                    confirmed = await self._submit()
                    continue
                if resubmits_left == 0:
                    return self._finish(
                        ProofStatus.LOST,
                        error="daemon lost the job again after one resubmission (NOT_FOUND twice)",
                    )
                resubmits_left -= 1
                log.warning(
                    "proof.resubmitted",
                    job_id=self.job_id,
                    attempt=self.submissions + 1,
                    reason="AwaitProof NOT_FOUND: the daemon lost the job (restart?)",
                )
                confirmed = await self._submit()
                continue
            return self._from_response(response)

    async def _submit(self) -> bool:
        """Submit; True if the daemon accepted it, False if we cannot know whether it landed."""
        policy = submit_policy(self.t)

        async def once() -> pb.SubmitProofResponse:
            timeout = min(self.t.submit_deadline_s, self.remaining())
            if timeout <= 0:
                raise _OutOfBudget()
            self.submissions += 1
            self.last_call = "SubmitProof"
            try:
                response: pb.SubmitProofResponse = await self.client.stub.SubmitProof(
                    self.request, timeout=timeout
                )
            except grpc.aio.AioRpcError as exc:
                self.last_error = _describe(exc)
                if is_connect_failure(exc):
                    self.submissions -= 1  # nothing reached the daemon
                raise
            return response

        retrying = policy.retrying(
            self.remaining(), _log_retry("proof.submit_retry", job_id=self.job_id)
        )
        try:
            response = await retrying(once)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            uncertain = code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                code == grpc.StatusCode.UNAVAILABLE and not is_connect_failure(exc)
            )
            if not uncertain:
                raise
            log.warning(
                "proof.submit_uncertain",
                job_id=self.job_id,
                attempt=self.submissions,
                code=code.name,
                reason=_describe(exc),
                action="await the job first; NOT_FOUND means it did not land",
            )
            return False
        if response.job_id and response.job_id != self.job_id:
            # The daemon names the job after the request id; follow it if it ever differs.
            self.job_id = response.job_id
        log.info(
            "proof.submitted",
            job_id=self.job_id,
            attempt=self.submissions,
            queue_position=response.queue_position,
            assigned_gpu=response.assigned_gpu,
            input_bytes=self.request.ByteSize(),
        )
        return True

    async def _await(self) -> pb.AwaitProofResponse:
        policy = await_policy(self.t)

        async def once() -> pb.AwaitProofResponse:
            timeout = min(self.t.await_deadline_s, self.remaining())
            if timeout <= 0:
                raise _OutOfBudget()
            self.await_attempts += 1
            self.last_call = "AwaitProof"
            try:
                response: pb.AwaitProofResponse = await self.client.stub.AwaitProof(
                    # timeout_ms is set for servers that honour it; the real one ignores it, so
                    # our own call deadline is what bounds the call.
                    pb.AwaitProofRequest(job_id=self.job_id, timeout_ms=int(timeout * 1000)),
                    timeout=timeout,
                )
            except grpc.aio.AioRpcError as exc:
                self.last_error = _describe(exc)
                raise
            if response.status == pb.AwaitProofResponse.TIMEOUT:
                self.last_error = _describe(_ServerTimedOut())
                raise _ServerTimedOut()
            return response

        retrying = policy.retrying(
            self.remaining(), _log_retry("proof.await_retry", job_id=self.job_id)
        )
        try:
            return await retrying(once)
        except _ServerTimedOut:
            raise _OutOfBudget() from None

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
        )
        fields = {
            "job_id": result.job_id,
            "wall_s": round(result.wall_s, 3),
            "submissions": result.submissions,
            "await_attempts": result.await_attempts,
        }
        if result.ok:
            log.info(
                "proof.completed",
                **fields,
                proof_len=result.proof_len,
                total_ms=result.timings.total_ms,
            )
        else:
            log.warning("proof.failed", **fields, status=str(status), error=error)
        return result


# --- batches ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchSummary:
    count: int
    concurrency: int
    completed: int
    failed: int
    wall_s: float
    """From the first proof's submit to the last proof's end (completed or failed)."""
    proofs_per_hour: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "concurrency": self.concurrency,
            "completed": self.completed,
            "failed": self.failed,
            "wall_s": round(self.wall_s, 3),
            "proofs_per_hour": round(self.proofs_per_hour, 3),
        }


@dataclass(frozen=True, slots=True)
class BatchResult:
    results: tuple[ProofResult, ...]
    """In submission order (index i is the i-th proof started)."""
    summary: BatchSummary


def summarize_batch(results: Sequence[ProofResult], concurrency: int) -> BatchSummary:
    """Pure: counts and rate of a finished batch."""
    completed = sum(1 for r in results if r.ok)
    wall = (
        max(r.finished_at for r in results) - min(r.started_at for r in results) if results else 0.0
    )
    return BatchSummary(
        count=len(results),
        concurrency=concurrency,
        completed=completed,
        failed=len(results) - completed,
        wall_s=wall,
        proofs_per_hour=proofs_per_hour(completed, wall),
    )


class Prover(Protocol):
    async def prove(
        self, request: pb.SubmitProofRequest, budget_s: float | None = None
    ) -> ProofResult: ...


async def run_batch(
    prover: Prover,
    template: pb.SubmitProofRequest,
    count: int,
    concurrency: int,
    *,
    budget_s: float | None = None,
    on_result: Callable[[int, ProofResult], None] | None = None,
) -> BatchResult:
    """Run ``count`` proofs of ``template``, at most ``concurrency`` at once.

    Each proof is a copy of the template with its own uuid4 ``request_id`` (the template's is
    ignored: the daemon does not de-duplicate, and every proof must be a distinct job). The next
    proof starts as soon as one finishes. ``on_result(index, result)`` is called as each ends.
    ``budget_s`` applies to each proof.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    results: list[ProofResult | None] = [None] * count
    indices = iter(range(count))

    async def worker() -> None:
        # One shared iterator: a worker takes the next index the moment its proof ends.
        for index in indices:
            request = pb.SubmitProofRequest()
            request.CopyFrom(template)
            request.request_id = str(uuid.uuid4())
            result = await prover.prove(request, budget_s)
            results[index] = result
            if on_result is not None:
                on_result(index, result)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, count)):
            group.create_task(worker())
    done = tuple(r for r in results if r is not None)
    return BatchResult(results=done, summary=summarize_batch(done, concurrency))
