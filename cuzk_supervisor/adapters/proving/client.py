"""Async gRPC client for the cuzk proving daemon: submit, then short awaits, retried on purpose.

The rules (docs/architecture.md, rule 3 and 5, incidents I1 and I3):

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
  blind: the job is awaited first, and NOT_FOUND then means "it did not land" (counted apart,
  ``uploads_cut``). A submit is retried directly only when nothing was sent (no connection).
- No dead connection outlives two deadlines: after two calls in a row on one channel are cut
  with nothing received, the next call gets a new channel (a silent path, no FIN and no RST, is
  otherwise noticed only by keepalive, minutes later).
- Every retry goes through tenacity with a ``RetryPolicy`` value: only transient codes,
  jittered exponential backoff, a stop at the remaining budget, each attempt logged.
- Failures are values: :meth:`ProvingClient.prove` returns a :class:`ProofResult` for a failed,
  lost or out-of-budget proof; it raises only for cancellation and programming errors.

This module is the client: its channel, the watch on each call and the reconnect, the short
calls and the readiness wait. Its parts are the sibling modules: ``channel`` (transport),
``errors`` (call outcomes), ``policy`` (deadlines, retries), ``run`` (one proof's loop),
``results`` and ``batch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc
import structlog

from cuzk_supervisor.adapters.proving.channel import (
    DEFAULT_KEEPALIVE,
    Keepalive,
    channel_options,
    until_listening,
)
from cuzk_supervisor.adapters.proving.errors import (
    DaemonCallError,
    DaemonNotReady,
    describe,
    is_connect_failure,
    received_nothing,
)
from cuzk_supervisor.adapters.proving.policy import (
    Attempt,
    ProvingTimeouts,
    call_policy,
    log_retry,
    ready_policy,
)
from cuzk_supervisor.adapters.proving.results import ProofResult
from cuzk_supervisor.adapters.proving.run import ProofRun
from cuzk_supervisor.address import Address
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

log = structlog.get_logger("supervisor.proving")

# Calls cut in a row, with nothing received, after which a channel is replaced.
RECONNECT_AFTER_CUTS = 2


@dataclass(eq=False, slots=True)
class _Conn:
    """One channel, its calls in flight and its calls cut in a row with nothing received."""

    channel: grpc.aio.Channel
    stub: pb_grpc.ProvingEngineStub
    number: int
    cuts: int = 0
    inflight: int = 0
    retired: bool = False


class ProvingClient:
    """Async client over one grpc.aio channel at a time. Use as ``async with ProvingClient(...)``.

    A channel whose last ``RECONNECT_AFTER_CUTS`` calls were all cut by our own deadline, with
    nothing received, is replaced before the next call (``on_reconnect``: counted in /metrics);
    the old one is closed once its calls in flight have ended, so other proofs are not disturbed.
    """

    def __init__(
        self,
        address: Address,
        timeouts: ProvingTimeouts | None = None,
        *,
        on_reconnect: Callable[[], None] | None = None,
        keepalive: Keepalive = DEFAULT_KEEPALIVE,
    ) -> None:
        self.address = address
        self.keepalive = keepalive
        self.timeouts = timeouts if timeouts is not None else ProvingTimeouts()
        self.on_reconnect = on_reconnect
        self.reconnects = 0
        self._conn: _Conn | None = None
        self._opened = 0
        self._retired: set[_Conn] = set()  # replaced, closed once their calls have ended
        self._closing: set[asyncio.Task[None]] = set()

    def _open(self) -> _Conn:
        channel = grpc.aio.insecure_channel(
            self.address.grpc_target(), options=channel_options(self.keepalive)
        )
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
        # Dial now, not at the next call: that call is often the submission that keeps the
        # pipeline fed, and should not wait for a connection to be made.
        self._conn.channel.get_state(try_to_connect=True)
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
        attempt = Attempt()

        async def once() -> Any:
            remaining = end - time.monotonic()
            timeout = max(min(self.timeouts.call_deadline_s, remaining), 0.001)
            attempt.begin(timeout)
            return await self.call(method, request, timeout=timeout)

        retrying = call_policy(self.timeouts).retrying(
            budget, log_retry("daemon.call_retry", method=method), attempt
        )
        try:
            return await retrying(once)
        except grpc.aio.AioRpcError as exc:
            raise DaemonCallError(method, self.address, exc.code(), exc.details() or "") from exc

    async def status(self, budget_s: float | None = None) -> pb.GetStatusResponse:
        """GetStatus, as ``_short_call``; raises DaemonCallError."""
        return await self._short_call("GetStatus", pb.GetStatusRequest(), budget_s)

    async def metrics(self, budget_s: float | None = None) -> str:
        """The daemon's Prometheus text (GetMetrics, as ``status``); raises DaemonCallError."""
        response = await self._short_call("GetMetrics", pb.GetMetricsRequest(), budget_s)
        return response.prometheus_text

    async def wait_ready(self, deadline_s: float | None = None) -> pb.GetStatusResponse:
        """Poll GetStatus until it answers; raise DaemonNotReady after ``deadline_s``.

        Calls are at least ``ready_poll_interval_s`` apart (the real daemon runs nvidia-smi for
        each), backing off to ``ready_poll_max_s``; each call is cut by ``call_deadline_s``. It
        gives up when the next poll would start past the deadline (``stop_before_delay``): up to
        one poll interval early. Only UNAVAILABLE and cuts are retried; any other answer is
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
            if not await until_listening(self.address, remaining):
                raise DaemonNotReady(
                    self.address, time.monotonic() - started, calls, "nothing listening there"
                )
            remaining = deadline - (time.monotonic() - started)
            calls += 1
            # wait_for_ready: a channel still in reconnect backoff waits to connect, not fails.
            timeout = max(min(self.timeouts.call_deadline_s, remaining), 0.001)
            return await self.call(
                "GetStatus", pb.GetStatusRequest(), timeout=timeout, wait_for_ready=True
            )

        retrying = policy.retrying(
            deadline, log_retry("daemon.ready_retry", address=str(self.address))
        )
        try:
            response: pb.GetStatusResponse = await retrying(once)
        except grpc.aio.AioRpcError as exc:
            raise DaemonNotReady(
                self.address, time.monotonic() - started, calls, describe(exc)
            ) from None
        log.info("daemon.ready", address=str(self.address), calls=calls,
                 waited_s=round(time.monotonic() - started, 3))  # fmt: skip
        return response

    async def prove(
        self, request: pb.SubmitProofRequest, budget_s: float | None = None
    ) -> ProofResult:
        """Submit one proof and await its result within ``budget_s`` (default: the timeouts').
        A request without ``request_id`` is copied with a uuid4 (the daemon's job id) in it."""
        budget = self.timeouts.proof_budget_s if budget_s is None else budget_s
        if not budget > 0:
            raise ValueError(f"budget_s must be > 0, got {budget!r}")
        if not request.request_id:
            copy = pb.SubmitProofRequest()
            copy.CopyFrom(request)
            copy.request_id = str(uuid.uuid4())
            request = copy
        return await ProofRun(self, request, budget).run()
