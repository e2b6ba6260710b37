"""An in-process fake cuzk daemon for client tests: a grpc.aio servicer on 127.0.0.1 (or a unix
socket), scriptable per test, counting what it receives.

It keeps the real daemon's quirks that matter to a client: ``timeout_ms`` is ignored (AwaitProof
blocks until the job ends), ``request_id`` is not de-duplicated (a second submit proves again),
a dropped await does not cancel the job, and an unknown job is NOT_FOUND. ``asyncio.sleep``
models proving time; nothing here sleeps to synchronise a test: tests wait on
:meth:`FakeDaemon.wait_for`.

Usage::

    async with FakeDaemon(Behaviour(proof_s=1.0)) as fake:
        async with ProvingClient(fake.address, timeouts) as client:
            ...
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from cuzk_supervisor.address import Address
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

PROOF = bytes(range(192)) * 10  # 1920 bytes, like a PoRep proof
SERVER_MESSAGE_LIMIT = 128 * 1024 * 1024  # the real daemon's


def free_port() -> int:
    """A TCP port nothing listens on right now (for tests that need 'nothing there')."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Behaviour:
    """What the fake does; counters (``*_left``) are consumed as calls arrive."""

    proof_s: float = 0.0
    """Modelled proving time of each job, from its submission."""
    fail_message: str = ""
    """When set, every job ends FAILED with this message (an OK RPC, as the real daemon)."""
    await_unavailable: int = 0
    """Abort the next N AwaitProof calls with UNAVAILABLE (the job keeps running)."""
    lose_job_on_await: int = 0
    """The next N AwaitProof calls find their job gone, as after a daemon restart: NOT_FOUND."""
    submit_hang: int = 0
    """The next N SubmitProof calls never enqueue and never answer (lost before landing)."""
    submit_ack_hang: int = 0
    """The next N SubmitProof calls enqueue the job, then never answer (landed, ack lost)."""
    submit_reject: int = 0
    """Abort the next N SubmitProof calls with INVALID_ARGUMENT (as a bad proof_kind)."""
    status_unavailable: int = 0
    """Abort the next N GetStatus calls with UNAVAILABLE (a huge N: never ready)."""
    metrics_text: str = "cuzk_proofs_completed_total 0\n"


@dataclass
class Job:
    job_id: str
    input_bytes: int
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: pb.AwaitProofResponse | None = None
    task: asyncio.Task[None] | None = None


class FakeDaemon(pb_grpc.ProvingEngineServicer):
    def __init__(self, behaviour: Behaviour | None = None, unix_path: Path | None = None) -> None:
        self.behaviour = behaviour if behaviour is not None else Behaviour()
        self._unix_path = unix_path
        self._port = 0
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        self.jobs: dict[str, Job] = {}
        # What arrived, in order.
        self.submit_calls: list[str] = []  # request ids of every SubmitProof received
        self.enqueued: list[str] = []  # request ids of every job started
        self.input_sizes: list[int] = []  # vanilla_proof sizes of enqueued jobs
        self.await_calls: list[str] = []  # job ids of every AwaitProof received
        self.await_timeout_ms: list[int] = []
        self.status_call_times: list[float] = []  # time.monotonic() of each GetStatus
        self.metrics_calls = 0
        self.completed: list[str] = []
        self.running = 0
        self.max_running = 0

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def address(self) -> Address:
        if self._unix_path is not None:
            return Address(path=self._unix_path)
        return Address(host="127.0.0.1", port=self._port)

    async def start(self, port: int = 0) -> Address:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", SERVER_MESSAGE_LIMIT),
                ("grpc.max_send_message_length", SERVER_MESSAGE_LIMIT),
            ]
        )
        pb_grpc.add_ProvingEngineServicer_to_server(self, server)
        if self._unix_path is not None:
            server.add_insecure_port(f"unix://{self._unix_path}")
        else:
            self._port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return self.address

    async def stop(self) -> None:
        for job in self.jobs.values():
            if job.task is not None:
                job.task.cancel()
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> FakeDaemon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for(self, predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (checked whenever the fake's state changes)."""
        async with asyncio.timeout(limit_s):
            async with self._changed:
                await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- jobs -----------------------------------------------------------------------------

    def _enqueue(self, request: pb.SubmitProofRequest) -> Job:
        job = Job(job_id=request.request_id, input_bytes=len(request.vanilla_proof))
        self.jobs[job.job_id] = job  # no de-duplication: a second submit replaces and reproves
        self.enqueued.append(job.job_id)
        self.input_sizes.append(job.input_bytes)
        job.task = asyncio.get_running_loop().create_task(self._prove(job))
        return job

    async def _prove(self, job: Job) -> None:
        started = time.monotonic()
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        await self._notify()
        try:
            await asyncio.sleep(self.behaviour.proof_s)  # models the proof, not a sync point
        finally:
            self.running -= 1
        total_ms = int((time.monotonic() - started) * 1000)
        if self.behaviour.fail_message:
            job.result = pb.AwaitProofResponse(
                job_id=job.job_id,
                status=pb.AwaitProofResponse.FAILED,
                error_message=self.behaviour.fail_message,
                total_ms=total_ms,
            )
        else:
            job.result = pb.AwaitProofResponse(
                job_id=job.job_id,
                status=pb.AwaitProofResponse.COMPLETED,
                proof=PROOF,
                synthesis_ms=total_ms,
                gpu_compute_ms=1,
                total_ms=total_ms,
            )
            self.completed.append(job.job_id)
        job.done.set()
        await self._notify()

    # --- RPCs -----------------------------------------------------------------------------

    async def SubmitProof(
        self, request: pb.SubmitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitProofResponse:
        if not request.request_id:
            request.request_id = f"fake-{len(self.submit_calls)}"
        self.submit_calls.append(request.request_id)
        await self._notify()
        b = self.behaviour
        if b.submit_reject > 0:
            b.submit_reject -= 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported proof kind")
        if b.submit_hang > 0:
            b.submit_hang -= 1
            await asyncio.Event().wait()  # never answers; the client's deadline cancels us
        self._enqueue(request)
        if b.submit_ack_hang > 0:
            b.submit_ack_hang -= 1
            await asyncio.Event().wait()
        return pb.SubmitProofResponse(job_id=request.request_id, queue_position=0)

    async def AwaitProof(
        self, request: pb.AwaitProofRequest, context: grpc.aio.ServicerContext
    ) -> pb.AwaitProofResponse:
        self.await_calls.append(request.job_id)
        self.await_timeout_ms.append(request.timeout_ms)
        await self._notify()
        b = self.behaviour
        job = self.jobs.get(request.job_id)
        if job is not None and b.lose_job_on_await > 0:
            b.lose_job_on_await -= 1
            del self.jobs[request.job_id]
            if job.task is not None:
                job.task.cancel()
            job = None
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id} not found")
        assert job is not None
        if b.await_unavailable > 0:
            b.await_unavailable -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped (injected)")
        # timeout_ms ignored, as the real daemon: block until the job ends. Event.wait is
        # cancelled with the call when the client's deadline passes; the job goes on.
        await job.done.wait()
        assert job.result is not None
        return job.result

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        self.status_call_times.append(time.monotonic())
        await self._notify()
        if self.behaviour.status_unavailable > 0:
            self.behaviour.status_unavailable -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "starting (injected)")
        return pb.GetStatusResponse(
            gpus=[pb.GPUStatus(ordinal=0, name="Fake GPU")],
            total_proofs_completed=len(self.completed),
            uptime_seconds=1,
        )

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        self.metrics_calls += 1
        return pb.GetMetricsResponse(prometheus_text=self.behaviour.metrics_text)
