"""Async gRPC client for the cuzk proving daemon: submit, then short awaits, retried on purpose.

The rules (DESIGN.md principles 4 and 5, incidents I1 and I3):

- No long RPC. A proof is one ``SubmitProof`` (returns at once) and then ``AwaitProof`` calls, each
  cut by *our* short deadline: the real server ignores ``timeout_ms`` and would hold the call for
  the whole proof, and a long call is what broke in the field.
- The server does not de-duplicate ``request_id``. A cut or dropped await means "await the same
  job again", never "submit again". Resubmit, with the same ``request_id``, only on NOT_FOUND
  (the daemon restarted and lost the job), once; a second loss is a failure.
- A cut call is a cut call, whoever cut it: ``CANCELLED`` from the server (tonic applies our
  own ``grpc-timeout`` on its side and answers "Timeout expired", sometimes a moment before our
  deadline fires) is handled exactly like our own ``DEADLINE_EXCEEDED``. Only a cancellation our
  own code started (a cancelled task, the client closing) is final.
- A submit whose fate is unknown (cut, or the connection dropped under it) is never retried
  blind: the job is awaited first, and NOT_FOUND then means "it did not land" (counted apart, as
  ``uploads_cut``, so ``submissions`` is what the daemon saw). A submit is retried directly only
  when the channel could not connect at all, i.e. nothing was sent.
- No dead connection outlives two deadlines: after two calls in a row on one channel are cut
  with nothing received, the client opens a new channel for the next call (a silent path, no
  FIN and no RST, is otherwise noticed only by keepalive, minutes later).
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
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from cuzk_supervisor.address import Address
from cuzk_supervisor.core.bench import proofs_per_hour
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

log = structlog.get_logger("supervisor.proving")

MIB = 1024 * 1024
# The daemon's own limit is 128 MiB each way; a PoRep input is ~51 MB and grpc-python's default
# receive limit is 4 MiB. Ours is higher than the server's so the server's is the one that counts.
MAX_MESSAGE_BYTES = 256 * MIB
# GetStatus runs nvidia-smi on the real daemon: never poll it faster than this.
MIN_READY_POLL_INTERVAL_S = 0.25
# grpc-core's message when a call failed because the channel could not connect: nothing was sent.
_CONNECT_FAILURE_MARK = "failed to connect to all addresses"
# grpc-core's message for a call our own process cancelled (not the server).
_LOCAL_CANCEL_MARK = "Locally cancelled"
# Calls cut in a row, with nothing received, after which a channel is replaced.
RECONNECT_AFTER_CUTS = 2


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

    A channel of ours never shares its connection with another channel
    (``use_local_subchannel_pool``): a replaced channel must get a new connection, not the
    frozen one the old channel still holds.
    """
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),
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


def is_own_cancel(exc: BaseException) -> bool:
    """True for a CANCELLED our own process caused (grpc-core's "Locally cancelled ...")."""
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.CANCELLED
        and _LOCAL_CANCEL_MARK in (exc.details() or "")
    )


CUT_CODES: frozenset[grpc.StatusCode] = frozenset(
    {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""A call cut by a deadline: ours (DEADLINE_EXCEEDED) or the server's (tonic: CANCELLED
"Timeout expired"; grpc-go: CANCELLED "Stream removed")."""


def is_cut(exc: BaseException) -> bool:
    """A call cut by a deadline, whoever cut it; never one our own code cancelled."""
    return _code_of(exc) in CUT_CODES and not is_own_cancel(exc)


def received_nothing(exc: BaseException) -> bool:
    """The call ended without a word from the server: our own deadline fired."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# --- retry policy -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Attempt:
    """When the current attempt started and its deadline (read by the backoff)."""

    started: float = 0.0
    deadline_s: float = 0.0

    def begin(self, deadline_s: float) -> None:
        self.started, self.deadline_s = time.monotonic(), deadline_s

    def waited_out(self) -> bool:
        """The attempt lasted at least half its deadline: a cut, not a quick refusal."""
        return time.monotonic() - self.started >= self.deadline_s / 2


class _PolicyWait(wait_base):
    """Full-jitter exponential backoff, except no wait after a deadline cut a call."""

    def __init__(self, policy: RetryPolicy, attempt: _Attempt | None = None) -> None:
        self._immediate = policy.immediate
        self._attempt = attempt
        self._backoff = wait_random_exponential(
            multiplier=policy.base_s, max=policy.max_s, min=policy.min_s
        )

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        # Only a real cut (the call already waited its length) skips the backoff; a server
        # answering TIMEOUT or CANCELLED at once must not make us spin.
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in self._immediate:
            ours = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if ours or self._attempt is None or self._attempt.waited_out():
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
    """Codes retried without backoff: a deadline cut the call, which already waited (a
    CANCELLED that came before half the call's deadline backs off like any error). The
    backoff's attempt counter still counts them, so a later transport error waits up to
    ``max_s``."""
    max_attempts: int | None = None
    """Stop after this many attempts (None: only the budget stops)."""
    unknown_fate: frozenset[grpc.StatusCode] = frozenset()
    """Codes after which the call may or may not have reached the daemon (UNAVAILABLE only when
    the channel had connected): not retried, resolved by the caller (submit: await first)."""

    def is_transient(self, exc: BaseException) -> bool:
        code = _code_of(exc)
        if code is None or code not in self.codes or is_own_cancel(exc):
            return False
        if self.before_send_only and code == grpc.StatusCode.UNAVAILABLE:
            return is_connect_failure(exc)
        return True

    def fate_unknown(self, exc: BaseException) -> bool:
        code = _code_of(exc)
        if code is None or code not in self.unknown_fate or is_own_cancel(exc):
            return False
        return code != grpc.StatusCode.UNAVAILABLE or not is_connect_failure(exc)

    def retrying(
        self,
        budget_s: float,
        before_sleep: Callable[[RetryCallState], None],
        attempt: _Attempt | None = None,
    ) -> AsyncRetrying:
        """A tenacity controller for one series of attempts that must end within ``budget_s``
        (``attempt``, when given, tells the backoff how long the last attempt waited)."""
        stop: stop_base = stop_before_delay(max(budget_s, 0.0))
        if self.max_attempts is not None:
            stop = stop | stop_after_attempt(self.max_attempts)
        return AsyncRetrying(
            retry=retry_if_exception(self.is_transient),
            wait=_PolicyWait(self, attempt),
            stop=stop,
            before_sleep=before_sleep,
            reraise=True,
        )


def submit_policy(t: ProvingTimeouts) -> RetryPolicy:
    """SubmitProof: retried only when nothing was sent (connection refused, no socket).

    A cut (our deadline or the server's CANCELLED) or UNAVAILABLE from a connection dropped
    mid-upload leaves us not knowing whether the job landed (``unknown_fate``): not retried
    here but resolved by awaiting the job (NOT_FOUND = not submitted). Risk, noted on purpose:
    a submit still being processed by the server when that await arrives could be proven
    twice; the window is the server's enqueue time.
    """
    return RetryPolicy(
        name="submit",
        codes=frozenset({grpc.StatusCode.UNAVAILABLE}),
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        before_send_only=True,
        unknown_fate=frozenset(
            {
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNAVAILABLE,
            }
        ),
    )


def await_policy(t: ProvingTimeouts) -> RetryPolicy:
    """AwaitProof: a cut (our deadline or the server's CANCELLED) or a transport error means
    "await the same job again"."""
    return RetryPolicy(
        name="await",
        codes=frozenset(
            {
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNAVAILABLE,
            }
        ),
        base_s=t.backoff_base_s,
        max_s=t.backoff_max_s,
        immediate=CUT_CODES,
    )


def ready_policy(t: ProvingTimeouts) -> RetryPolicy:
    """GetStatus while starting: not listening yet, or cut (too slow to answer, by our deadline
    or the server's); never too often."""
    return RetryPolicy(
        name="ready",
        codes=frozenset(
            {
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNAVAILABLE,
            }
        ),
        base_s=t.ready_poll_interval_s,
        max_s=t.ready_poll_max_s,
        min_s=t.ready_poll_interval_s,
    )


def call_policy(t: ProvingTimeouts) -> RetryPolicy:
    """GetStatus (a liveness probe) and GetMetrics after start: a call the *server* cut
    (CANCELLED) gets one more try within the caller's budget; our own deadline passing means
    the budget is spent, and anything else is the answer."""
    return RetryPolicy(
        name="call",
        codes=frozenset({grpc.StatusCode.CANCELLED}),
        base_s=MIN_READY_POLL_INTERVAL_S,
        max_s=MIN_READY_POLL_INTERVAL_S,
        min_s=MIN_READY_POLL_INTERVAL_S,
        max_attempts=2,
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
    """SubmitProof calls the daemon saw (refused connections and cut uploads not counted)."""
    await_attempts: int = 0
    """AwaitProof calls made."""
    uploads_cut: int = 0
    landed_at: float | None = None
    """``time.monotonic()`` when the daemon accepted the job this result is of (its SubmitProof
    answered); None when that was never seen (a submit whose fate was unknown)."""
    """SubmitProof calls cut before they landed (cut, then the job was NOT_FOUND)."""

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
            "uploads_cut": self.uploads_cut,
            "await_attempts": self.await_attempts,
            "queue_wait_ms": self.timings.queue_wait_ms,
            "srs_load_ms": self.timings.srs_load_ms,
            "synthesis_ms": self.timings.synthesis_ms,
            "gpu_compute_ms": self.timings.gpu_compute_ms,
            "total_ms": self.timings.total_ms,
        }


# --- the client -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Conn:
    """One channel and what we know of it: calls in flight, and calls cut in a row with
    nothing received from the server."""

    channel: grpc.aio.Channel
    stub: pb_grpc.ProvingEngineStub
    number: int
    cuts: int = 0
    inflight: int = 0
    retired: bool = False


class ProvingClient:
    """Async client over one grpc.aio channel at a time. Use as ``async with
    ProvingClient(...) as c``.

    A channel whose last ``RECONNECT_AFTER_CUTS`` calls were all cut by our own deadline, with
    nothing received, is replaced before the next call: the new one dials a new connection
    (``reconnect`` logged, ``on_reconnect`` called: the supervisor counts it in /metrics). The
    old one is closed once its calls in flight have ended, so other proofs are not disturbed.
    """

    def __init__(
        self,
        address: Address,
        timeouts: ProvingTimeouts | None = None,
        *,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self.timeouts = timeouts if timeouts is not None else ProvingTimeouts()
        self.on_reconnect = on_reconnect
        self.reconnects = 0
        self._conn: _Conn | None = None
        self._opened = 0
        self._retired: set[_Conn] = set()  # replaced, closed once their calls have ended
        self._closing: set[asyncio.Task[None]] = set()

    def _open(self) -> _Conn:
        channel = grpc.aio.insecure_channel(self.address.grpc_target(), options=channel_options())
        self._opened += 1
        return _Conn(channel, pb_grpc.ProvingEngineStub(channel), self._opened)

    async def __aenter__(self) -> Self:
        self._conn = self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.channel.close(grace=None)
        for old in list(self._retired):
            self._retired.discard(old)
            await old.channel.close(grace=None)
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task

    @property
    def stub(self) -> pb_grpc.ProvingEngineStub:
        """The current channel's stub (calls made on it directly are not watched for cuts)."""
        return self._current().stub

    def _current(self) -> _Conn:
        if self._conn is None:
            raise RuntimeError("ProvingClient is not open: use `async with ProvingClient(...)`")
        return self._conn

    async def call(
        self,
        method: str,
        request: Any,
        *,
        timeout: float,  # noqa: ASYNC109 - a gRPC deadline (it goes out as grpc-timeout)
        wait_for_ready: bool | None = None,
    ) -> Any:
        """One unary call on the current channel, watched: its outcome tells whether the
        connection is alive (an answer, any status from the server) or maybe dead (cut by our
        own deadline with nothing received)."""
        conn = self._current()
        conn.inflight += 1
        try:
            response = await getattr(conn.stub, method)(
                request, timeout=timeout, wait_for_ready=wait_for_ready
            )
        except grpc.aio.AioRpcError as exc:
            if received_nothing(exc):
                conn.cuts += 1
                if conn.cuts >= RECONNECT_AFTER_CUTS and conn is self._conn:
                    self._reconnect(conn, method)
            elif not is_connect_failure(exc) and exc.code() != grpc.StatusCode.UNAVAILABLE:
                conn.cuts = 0  # the server answered: the connection is alive
            raise
        else:
            conn.cuts = 0
            return response
        finally:
            conn.inflight -= 1
            if conn.retired and conn.inflight == 0:
                self._close_later(conn)

    def _reconnect(self, old: _Conn, method: str) -> None:
        old.retired = True
        self._retired.add(old)
        self._conn = self._open()
        self.reconnects += 1
        # info, not warning: during a long proof two awaits in a row cut by our own deadline is
        # also what a healthy connection looks like (the server holds the call in silence), so
        # a reconnect every 2 x await_deadline_s is the normal price of noticing a dead one.
        log.info(
            "proving.reconnect",
            address=str(self.address),
            channel=self._conn.number,
            reason=f"{old.cuts} calls in a row cut with nothing received (last: {method})",
            in_flight_on_old=old.inflight,
        )
        if self.on_reconnect is not None:
            self.on_reconnect()

    def _close_later(self, conn: _Conn) -> None:
        if conn not in self._retired:
            return  # closed already (the client was closed)
        self._retired.discard(conn)
        task = asyncio.get_running_loop().create_task(conn.channel.close(grace=None))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _short_call(self, method: str, request: Any, budget_s: float | None) -> Any:
        """GetStatus/GetMetrics within ``budget_s`` (default: ``call_deadline_s``): a call the
        server cut (CANCELLED) gets one more try if the budget allows; raises DaemonCallError."""
        budget = self.timeouts.call_deadline_s if budget_s is None else budget_s
        end = time.monotonic() + budget
        attempt = _Attempt()

        async def once() -> Any:
            remaining = end - time.monotonic()
            timeout = max(min(self.timeouts.call_deadline_s, remaining), 0.001)
            attempt.begin(timeout)
            return await self.call(method, request, timeout=timeout)

        retrying = call_policy(self.timeouts).retrying(
            budget, _log_retry("daemon.call_retry", method=method), attempt
        )
        try:
            return await retrying(once)
        except grpc.aio.AioRpcError as exc:
            raise DaemonCallError(method, self.address, exc.code(), exc.details() or "") from exc

    async def status(self, budget_s: float | None = None) -> pb.GetStatusResponse:
        """GetStatus with the short deadline; one more poll if the server cut it and the
        budget (default ``call_deadline_s``) allows; raises DaemonCallError."""
        response: pb.GetStatusResponse = await self._short_call(
            "GetStatus", pb.GetStatusRequest(), budget_s
        )
        return response

    async def metrics(self, budget_s: float | None = None) -> str:
        """The daemon's Prometheus text (GetMetrics, as ``status``); raises DaemonCallError."""
        response: pb.GetMetricsResponse = await self._short_call(
            "GetMetrics", pb.GetMetricsRequest(), budget_s
        )
        return response.prometheus_text

    async def wait_ready(self, deadline_s: float | None = None) -> pb.GetStatusResponse:
        """Poll GetStatus until it answers; raise DaemonNotReady after ``deadline_s``.

        Calls are at least ``ready_poll_interval_s`` apart (the real daemon runs nvidia-smi for
        each), backing off to ``ready_poll_max_s``; each call is cut by ``call_deadline_s``.
        It gives up when the next poll would start past the deadline (tenacity's
        ``stop_before_delay``), so it can end up to one poll interval before ``deadline_s``.
        Only UNAVAILABLE and cuts (DEADLINE_EXCEEDED, or CANCELLED from the server) are retried;
        any other answer is raised as DaemonNotReady at once (e.g. UNIMPLEMENTED: not a cuzk
        daemon).
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
            response: pb.GetStatusResponse = await self.call(
                "GetStatus",
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
        self.uploads_cut = 0
        self.submit_cut = False  # the last submit whose fate is unknown was cut (not dropped)
        self.landed_at: float | None = None
        self.await_attempts = 0
        self.attempt = _Attempt()
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
                    # A *cut* submit (the daemon alive, its deadline or ours) is then one the
                    # daemon never saw; a dropped connection may have taken a daemon, and the
                    # job it had, with it: that one stays counted.
                    if self.submit_cut:
                        self.submissions -= 1
                        self.uploads_cut += 1
                    log.info(
                        "proof.submit_not_landed",
                        job_id=self.job_id,
                        uploads_cut=self.uploads_cut,
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
                response: pb.SubmitProofResponse = await self.client.call(
                    "SubmitProof", self.request, timeout=timeout
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
            if not policy.fate_unknown(exc):
                raise
            self.submit_cut = is_cut(exc)
            log.warning(
                "proof.submit_uncertain",
                job_id=self.job_id,
                attempt=self.submissions,
                code=code.name,
                reason=_describe(exc),
                action="await the job first; NOT_FOUND means it did not land",
            )
            return False
        self.landed_at = time.monotonic()
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
                self.last_error = _describe(exc)
                raise
            if response.status == pb.AwaitProofResponse.TIMEOUT:
                self.last_error = _describe(_ServerTimedOut())
                raise _ServerTimedOut()
            return response

        retrying = policy.retrying(
            self.remaining(), _log_retry("proof.await_retry", job_id=self.job_id), self.attempt
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
            uploads_cut=self.uploads_cut,
            landed_at=self.landed_at,
        )
        fields = {
            "job_id": result.job_id,
            "wall_s": round(result.wall_s, 3),
            "submissions": result.submissions,
            "uploads_cut": result.uploads_cut,
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
