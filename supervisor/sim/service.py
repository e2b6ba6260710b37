"""The ``cuzk.v1.ProvingEngine`` servicer, with the real server's quirks.

Every handler passes the hang gate on the way in and on the way out, so after ``hang`` fires
even a call already waiting is never answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

import grpc

from supervisor.proto import proving_pb2 as pb
from supervisor.proto import proving_pb2_grpc as pb_grpc
from supervisor.sim import model, reports
from supervisor.sim.chaos import HangGate
from supervisor.sim.engine import Engine, Job

# The real server's limits, both ways.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Keepalive enforcement is left at grpc-core's defaults on purpose: a client pinging too
    # often gets GOAWAY too_many_pings, as from the real (tonic) server.
]


# When the current call's headers arrived (loop time); set per call by ArrivalStamp.
CALL_ARRIVED: ContextVar[float | None] = ContextVar("cuzk_sim_call_arrived", default=None)


class ArrivalStamp(grpc.aio.ServerInterceptor):
    """Notes when a call arrives, before its (maybe 50 MB) message has been received: grpc.aio
    runs interceptors and then the handler in the same task, so the stamp reaches the handler."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        CALL_ARRIVED.set(asyncio.get_running_loop().time())
        return await continuation(handler_call_details)


class ProvingService(pb_grpc.ProvingEngineServicer):
    def __init__(self, engine: Engine, gate: HangGate, memory_scale: float) -> None:
        self._engine = engine
        self._gate = gate
        self._memory_scale = memory_scale

    async def _submit(
        self, request: pb.SubmitProofRequest, context: grpc.aio.ServicerContext
    ) -> Job:
        if request.proof_kind not in model.QUEUE_NAME:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid proof_kind: {request.proof_kind}",
            )
        return self._engine.submit(request, arrived=CALL_ARRIVED.get())

    async def _await(self, job: Job) -> pb.AwaitProofResponse:
        # shield: a dropped call must not cancel the job's future; the job keeps running.
        return await asyncio.shield(job.done)

    async def SubmitProof(
        self, request: pb.SubmitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitProofResponse:
        await self._gate.hold()
        job = await self._submit(request, context)
        position = self._engine.queue_position(job)
        await self._gate.hold()
        return pb.SubmitProofResponse(job_id=job.job_id, queue_position=position)

    async def AwaitProof(
        self, request: pb.AwaitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.AwaitProofResponse:
        await self._gate.hold()
        job = self._engine.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job not found: {request.job_id}")
        # request.timeout_ms is ignored, as by the real server: this blocks until the job ends.
        result = await self._await(job)
        await self._gate.hold()
        return result

    async def Prove(
        self, request: pb.ProveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProveResponse:
        await self._gate.hold()
        if not request.HasField("submit"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing submit request")
        job = await self._submit(request.submit, context)
        result = await self._await(job)
        await self._gate.hold()
        return pb.ProveResponse(result=result)

    async def CancelProof(
        self, request: pb.CancelProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelProofResponse:
        await self._gate.hold()
        return pb.CancelProofResponse(was_running=False)  # not implemented by the real one

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        await self._gate.hold()
        return reports.get_status(self._engine)

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        await self._gate.hold()
        return pb.GetMetricsResponse(prometheus_text=reports.metrics_text(self._engine))

    async def PreloadSRS(
        self, request: pb.PreloadSrsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreloadSrsResponse:
        await self._gate.hold()
        if request.circuit_id not in model.SRS_GIB:
            await context.abort(
                grpc.StatusCode.INTERNAL, f"unknown circuit id: {request.circuit_id!r}"
            )
        already = self._engine.resident.loaded(request.circuit_id)
        seconds = await self._engine.resident.load_srs(request.circuit_id)
        await self._gate.hold()
        return pb.PreloadSrsResponse(already_loaded=already, load_time_ms=round(seconds * 1000))

    async def EvictSRS(
        self, request: pb.EvictSrsRequest, context: grpc.aio.ServicerContext
    ) -> pb.EvictSrsResponse:
        await self._gate.hold()
        return pb.EvictSrsResponse(was_loaded=False, freed_bytes=0)  # not implemented either


async def start_grpc_server(service: ProvingService, private_target: str) -> grpc.aio.Server:
    """Serve on the private (abstract unix) socket the public listener proxies to."""
    server = grpc.aio.server(interceptors=[ArrivalStamp()], options=SERVER_OPTIONS)
    pb_grpc.add_ProvingEngineServicer_to_server(service, server)
    server.add_insecure_port(private_target)
    await server.start()
    return server
