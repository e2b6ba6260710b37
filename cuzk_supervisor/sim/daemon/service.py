"""The ``cuzk.v1.ProvingEngine`` servicer, with the real server's quirks and tonic's transport
rules (server-side deadlines, keepalive; docs/daemon.md "Transport behaviour").

Every handler passes the hang gate on the way in and on the way out, so after ``hang`` fires
even a call already waiting is never answered (not even by its server-side deadline).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import grpc

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc
from cuzk_supervisor.sim.daemon import model, reports
from cuzk_supervisor.sim.daemon.chaos import FaultController, HangGate
from cuzk_supervisor.sim.daemon.engine import Engine
from cuzk_supervisor.sim.daemon.job import Job
from cuzk_supervisor.sim.daemon.transport import CallRules

# The real server's limits, both ways.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# tonic/h2 acknowledges every PING and never sends GOAWAY too_many_pings: no enforcement.
TONIC_KEEPALIVE = [
    ("grpc.http2.min_ping_interval_without_data_ms", 0),
    ("grpc.http2.max_ping_strikes", 0),  # 0 = bear any number of pings
    ("grpc.keepalive_permit_without_calls", 1),
]
# grpc-core's and grpc-go's policy (``--strict-keepalive``): a ping less than 5 min after the
# last one, with no data sent, is a strike; the second strike is GOAWAY too_many_pings.
STRICT_MIN_PING_INTERVAL_MS = 300_000


def strict_keepalive_options(scale: float = 1.0) -> list[tuple[str, int]]:
    """grpc-core's ping policy, its 5 min floor divided by ``scale`` (``--keepalive-scale``:
    a client whose keepalive is divided the same way is checked against it in seconds)."""
    return [
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            round(STRICT_MIN_PING_INTERVAL_MS / scale),
        ),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 0),
    ]


TIMEOUT_EXPIRED = "Timeout expired"  # tonic's text for a call past its grpc-timeout
# How far ahead of the server's timer the client's own can fire and cancel the call (the hop
# from the client's start to our reading of its headers, on a loaded loopback).
CLIENT_TIMER_LEAD_S = 0.25
T = TypeVar("T")


# When the current call's headers arrived (loop time); set per call by ArrivalStamp.
CALL_ARRIVED: ContextVar[float | None] = ContextVar("cuzk_sim_call_arrived", default=None)


class ArrivalStamp(grpc.aio.ServerInterceptor):
    """Notes when a call arrives, before its (maybe 50 MB) message has been received: grpc.aio
    runs interceptors and then the handler in the same task, so the stamp reaches the handler."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        CALL_ARRIVED.set(asyncio.get_running_loop().time())
        return await continuation(handler_call_details)


class ProvingService(pb_grpc.ProvingEngineServicer):
    """Every handler runs under the server-side deadline (``_answer``): past the client's
    ``grpc-timeout`` (less the ``cancel-early`` lead) the call ends ``CANCELLED`` "Timeout
    expired", as tonic ends it; the job it was waiting for is not touched."""

    def __init__(
        self,
        engine: Engine,
        gate: HangGate,
        rules: CallRules | None = None,
        faults: FaultController | None = None,
    ) -> None:
        self._engine = engine
        self._gate = gate
        self._rules = rules if rules is not None else CallRules()
        self._faults = faults
        self.deadline_cuts: Counter[str] = Counter()  # calls cut by their server-side deadline

    async def _answer(
        self,
        context: grpc.aio.ServicerContext,
        call: str,
        work: Callable[[str | None], Awaitable[T]],
    ) -> T:
        """Run ``work`` (given the ARG of a ``cancel`` fault that fired for this call, if any)
        within the call's server-side deadline."""
        await self._gate.hold()
        fired = self._faults.check("call", call=call) if self._faults is not None else []
        cancel = next((spec.arg for spec in fired if spec.kind == "cancel"), None)
        remaining = context.time_remaining()
        if remaining is None:
            result = await work(cancel)
        else:
            try:
                async with asyncio.timeout(max(0.0, remaining - self._rules.deadline_lead_s)):
                    result = await work(cancel)
            except TimeoutError:
                await self._gate.hold()  # a hung daemon answers nothing, not even this
                self.deadline_cuts[call] += 1
                await context.abort(grpc.StatusCode.CANCELLED, TIMEOUT_EXPIRED)
            except asyncio.CancelledError:
                # The client's timer started a hop before ours, so its cancel can end the call a
                # moment before our own cut would have: the call still ended at its deadline.
                left = context.time_remaining()
                if left is not None and left < CLIENT_TIMER_LEAD_S + self._rules.deadline_lead_s:
                    self.deadline_cuts[call] += 1
                raise
        await self._gate.hold()
        return result

    async def _cancelled(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.CANCELLED, TIMEOUT_EXPIRED)

    async def _submit(
        self, request: pb.SubmitProofRequest, context: grpc.aio.ServicerContext
    ) -> Job:
        if request.proof_kind not in model.QUEUE_NAME:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid proof_kind: {request.proof_kind}"
            )
        return self._engine.submit(request, arrived=CALL_ARRIVED.get())

    async def SubmitProof(
        self, request: pb.SubmitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitProofResponse:
        async def work(cancel: str | None) -> pb.SubmitProofResponse:
            if cancel == "submit-before":
                await self._cancelled(context)  # cut before the job was enqueued
            job = await self._submit(request, context)
            if cancel == "submit-after":
                await self._cancelled(context)  # enqueued; only the answer is lost
            position = self._engine.queue_position(job)
            return pb.SubmitProofResponse(job_id=job.job_id, queue_position=position)

        return await self._answer(context, "submit", work)

    async def AwaitProof(
        self, request: pb.AwaitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.AwaitProofResponse:
        async def work(cancel: str | None) -> pb.AwaitProofResponse:
            if cancel is not None:
                await self._cancelled(context)
            # Finished results first: a finished id gets its stored result at once.
            finished = self._engine.results.get(request.job_id)
            if finished is not None:
                return finished
            job = self._engine.jobs.get(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"job not found: {request.job_id}")
            # timeout_ms is ignored, as by the real server: this blocks until the job ends
            # (or the server-side deadline cuts the call).
            return await self._engine.wait(job.job_id)

        return await self._answer(context, "await", work)

    async def Prove(
        self, request: pb.ProveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProveResponse:
        async def work(cancel: str | None) -> pb.ProveResponse:
            if cancel is not None:
                await self._cancelled(context)
            if not request.HasField("submit"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing submit field")
            job_id = request.submit.request_id
            finished = self._engine.results.get(job_id) if job_id else None
            if finished is not None:
                return pb.ProveResponse(result=finished)  # no new proof
            # An id still running is proved again (docs/daemon.md, "Finished and running
            # ids"), and this call is answered by whichever of its jobs finishes first.
            job = await self._submit(request.submit, context)
            return pb.ProveResponse(result=await self._engine.wait(job.job_id))

        return await self._answer(context, "prove", work)

    async def CancelProof(
        self, request: pb.CancelProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelProofResponse:
        async def work(cancel: str | None) -> pb.CancelProofResponse:
            return pb.CancelProofResponse(was_running=False)  # not implemented by the real one

        return await self._answer(context, "cancel", work)

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        async def work(cancel: str | None) -> pb.GetStatusResponse:
            if cancel is not None:
                await self._cancelled(context)
            return reports.get_status(self._engine)

        return await self._answer(context, "status", work)

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        async def work(cancel: str | None) -> pb.GetMetricsResponse:
            if cancel is not None:
                await self._cancelled(context)
            text = reports.metrics_text(self._engine, self.deadline_cuts)
            return pb.GetMetricsResponse(prometheus_text=text)

        return await self._answer(context, "metrics", work)

    async def PreloadSRS(
        self, request: pb.PreloadSrsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreloadSrsResponse:
        async def work(cancel: str | None) -> pb.PreloadSrsResponse:
            if request.circuit_id not in model.SRS_GIB:
                await context.abort(
                    grpc.StatusCode.INTERNAL, f"unknown circuit ID: {request.circuit_id}"
                )
            already = self._engine.resident.loaded(request.circuit_id)
            # A cut call does not stop the load (it runs on, as the real one's blocking task).
            seconds = await asyncio.shield(self._engine.resident.load_srs(request.circuit_id))
            return pb.PreloadSrsResponse(already_loaded=already, load_time_ms=round(seconds * 1000))

        return await self._answer(context, "preload", work)

    async def EvictSRS(
        self, request: pb.EvictSrsRequest, context: grpc.aio.ServicerContext
    ) -> pb.EvictSrsResponse:
        async def work(cancel: str | None) -> pb.EvictSrsResponse:
            return pb.EvictSrsResponse(was_loaded=False, freed_bytes=0)  # not implemented either

        return await self._answer(context, "evict", work)


async def start_grpc_server(
    service: ProvingService,
    private_target: str,
    *,
    strict_keepalive: bool = False,
    keepalive_scale: float = 1.0,
) -> grpc.aio.Server:
    """Serve on the private (abstract unix) socket the public listener proxies to, with
    tonic's keepalive (every PING acked) or, ``strict_keepalive``, grpc-core's policy (its floor
    divided by ``keepalive_scale``)."""
    keepalive = strict_keepalive_options(keepalive_scale) if strict_keepalive else TONIC_KEEPALIVE
    server = grpc.aio.server(interceptors=[ArrivalStamp()], options=SERVER_OPTIONS + keepalive)
    pb_grpc.add_ProvingEngineServicer_to_server(service, server)
    server.add_insecure_port(private_target)
    await server.start()
    return server
