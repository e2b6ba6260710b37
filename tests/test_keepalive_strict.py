"""Issue 11: the client's keepalive against a server with grpc-core's strict ping policy (the sim's
``--strict-keepalive``: 5 min between pings without data, 2 strikes, then GOAWAY too_many_pings).

An await loop longer than one keepalive interval with the default settings must never be told
too_many_pings; a client pinging every second is, within seconds (so the test can fail). The
loop runs on a clock divided by ``keepaliveprobe.SCALE`` on both sides (the server's floor, the
client's keepalive and await deadline), so the same ratios are checked in 13 s instead of 400 s;
``python tests/keepaliveprobe.py FOLDER`` runs the full real-time loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import keepaliveprobe
import pytest
from keepaliveprobe import AWAIT_DEADLINE_S, LOOP_S, SCALE
from simhelpers import SimProcess

from cuzk_supervisor.adapters.proving.channel import Keepalive
from cuzk_supervisor.adapters.proving.results import ProofStatus
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow


@pytest.fixture
def stuck_sim(tmp_path: Path) -> Iterator[SimProcess]:
    with keepaliveprobe.stuck_sim(tmp_path, SCALE) as sim:
        yield sim


def test_the_scaled_loop_keeps_the_real_ratios() -> None:
    scaled = Keepalive().scaled(SCALE)
    # The client pings after a call's silence longer than the server's floor, by the same margin.
    assert scaled.time_ms / (300_000 / SCALE) == pytest.approx(Keepalive().time_ms / 300_000)
    assert LOOP_S / SCALE > scaled.time_ms / 1000 > AWAIT_DEADLINE_S / SCALE


def test_default_await_loop_past_a_keepalive_interval_gets_no_goaway(
    stuck_sim: SimProcess,
) -> None:
    outcome = asyncio.run(keepaliveprobe.await_loop(stuck_sim.listen, SCALE))
    # Not a margin: a lower bound (the loop really ran past a keepalive interval); a slow
    # machine only makes it longer.
    assert outcome["elapsed_s"] >= (LOOP_S - AWAIT_DEADLINE_S - 1) / SCALE
    # Every await ended as a cut (ours or the server's), never as a GOAWAY.
    assert outcome["status"] == ProofStatus.BUDGET_EXHAUSTED.name
    assert len(outcome["retry_codes"]) >= 10
    assert set(outcome["retry_codes"]) <= {"DEADLINE_EXCEEDED", "CANCELLED"}
    texts = outcome["events_text"].lower()
    assert "too many pings" not in texts
    assert "too_many_pings" not in texts


def test_a_client_pinging_every_second_gets_goaway_too_many_pings(stuck_sim: SimProcess) -> None:
    # Every 1/SCALE s against the scaled floor: the same ratio as every second against 5 min.
    pings = [
        ("grpc.keepalive_time_ms", round(1000 / SCALE)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(stuck_sim.target, options=pings) as channel:
        stub = pb_grpc.ProvingEngineStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.AwaitProof(pb.AwaitProofRequest(job_id="stuck"), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "too many pings" in (err.value.details() or "").lower()
