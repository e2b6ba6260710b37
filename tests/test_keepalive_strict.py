"""Issue 11: the client's keepalive against a server with grpc-core's strict ping policy (the sim's
``--strict-keepalive``: 5 min between pings without data, 2 strikes, then GOAWAY too_many_pings).

A 400 s (real time) await loop with the default settings must never be told too_many_pings; a
client pinging every second is, within seconds (so the test can fail). Slow on purpose: the
policy's window is five real minutes and cannot be scaled.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from simhelpers import SimProcess, free_tcp_port, submit_request, write_config

from cuzk_supervisor.adapters.proving import ProvingClient
from cuzk_supervisor.adapters.provingpolicy import ProvingTimeouts
from cuzk_supervisor.adapters.provingresults import ProofStatus
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

LOOP_S = 400.0


@pytest.fixture
def stuck_sim(tmp_path: Path) -> Iterator[SimProcess]:
    """A strict-keepalive sim whose jobs never end (workers stopped after "stuck" arrived)."""
    config = write_config(
        tmp_path, synthesis={"partition_workers": 1}, srs={"param_cache": str(tmp_path)}
    )
    sim = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}", config=config, args=["--strict-keepalive"]
    )
    try:
        assert "keepalive=strict" in sim.wait_for_line("simulator settings")
        sim.stub().SubmitProof(submit_request("stuck"), timeout=5)
        sim.send(signal.SIGINT)
        sim.wait_for_line("stopping engine workers")
        yield sim
    finally:
        sim.kill()


@pytest.mark.timeout(LOOP_S + 120)
async def test_default_await_loop_of_400_s_gets_no_goaway(stuck_sim: SimProcess) -> None:
    events: list[dict] = []

    def capture(logger: object, method: str, event_dict: dict) -> dict:
        events.append(dict(event_dict))
        raise structlog.DropEvent

    old = structlog.get_config()["processors"]
    structlog.configure(processors=[capture])
    try:
        async with ProvingClient(parse_address(stuck_sim.listen), ProvingTimeouts()) as client:
            # Its job never ends: the client awaits it (30 s calls) until the budget is spent.
            started = time.monotonic()
            result = await client.prove(submit_request("loop"), budget_s=LOOP_S)
    finally:
        structlog.configure(processors=old)
    assert time.monotonic() - started >= LOOP_S - 31
    # Every await ended as a cut (ours or the server's), never as a GOAWAY.
    assert result.status is ProofStatus.BUDGET_EXHAUSTED
    retries = [e for e in events if e.get("event") == "proof.await_retry"]
    assert len(retries) >= 10
    assert {e["code"] for e in retries} <= {"DEADLINE_EXCEEDED", "CANCELLED"}
    texts = " ".join(str(e) for e in events).lower()
    assert "too many pings" not in texts
    assert "too_many_pings" not in texts


def test_a_client_pinging_every_second_gets_goaway_too_many_pings(stuck_sim: SimProcess) -> None:
    pings = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(stuck_sim.target, options=pings) as channel:
        stub = pb_grpc.ProvingEngineStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.AwaitProof(pb.AwaitProofRequest(job_id="stuck"), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "too many pings" in (err.value.details() or "").lower()
