"""Issue 11: the client's keepalive against a server with grpc-core's strict ping policy (the sim's
``--strict-keepalive``: 5 min between pings without data, 2 strikes, then GOAWAY too_many_pings).

A 400 s (real time) await loop with the default settings must never be told too_many_pings; a
client pinging every second is, within seconds (so the test can fail). Slow on purpose: the
policy's window is five real minutes and cannot be scaled; the loop runs in the background from
the suite's collection on (tests/keepaliveprobe.py), so it does not hold a worker.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import keepaliveprobe
import pytest
from keepaliveprobe import LOOP_S
from simhelpers import SimProcess, poll_until

from cuzk_supervisor.adapters.proving.results import ProofStatus
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow


@pytest.fixture
def stuck_sim(tmp_path: Path) -> Iterator[SimProcess]:
    with keepaliveprobe.stuck_sim(tmp_path) as sim:
        yield sim


@pytest.mark.timeout(keepaliveprobe.PROBE_LIMIT_S + 60)
def test_default_await_loop_of_400_s_gets_no_goaway() -> None:
    # The loop runs in the background from the suite's collection on (conftest, keepaliveprobe):
    # this waits only for what is left of it.
    folder = keepaliveprobe.folder_for_run()
    keepaliveprobe.start(folder)  # run alone, nothing started it yet
    outcome = poll_until(
        lambda: keepaliveprobe.read(folder), keepaliveprobe.PROBE_LIMIT_S, interval=1.0,
        what="the keepalive probe's result",
    )  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    assert "error" not in outcome, outcome.get("trace")
    assert outcome["elapsed_s"] >= LOOP_S - 31
    # Every await ended as a cut (ours or the server's), never as a GOAWAY.
    assert outcome["status"] == ProofStatus.BUDGET_EXHAUSTED.name
    assert len(outcome["retry_codes"]) >= 10
    assert set(outcome["retry_codes"]) <= {"DEADLINE_EXCEEDED", "CANCELLED"}
    texts = outcome["events_text"].lower()
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
