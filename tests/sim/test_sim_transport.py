"""tonic's transport rules in the sim process (docs/daemon.md "Transport behaviour"): a server-side
deadline from the client's grpc-timeout (CANCELLED "Timeout expired", early with
``cancel-early``), ``cancel`` for one call, and ``freeze`` (open but silent connections),
distinct from ``hang``."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from simhelpers import SimProcess, poll_until, submit_request, write_config

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

Start = Callable[..., SimProcess]


def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path, synthesis={"partition_workers": 2}, srs={"param_cache": str(tmp_path)}
    )


def stuck(sim: SimProcess, job_id: str = "stuck") -> None:
    """A job that never ends: submitted, then the workers stopped (SIGINT)."""
    sim.stub().SubmitProof(submit_request(job_id), timeout=5)
    sim.send(signal.SIGINT)
    sim.wait_for_line("stopping engine workers")


def cuts(sim: SimProcess, call: str) -> int:
    match = re.search(rf'cuzk_sim_deadline_cuts_total\{{call="{call}"\}} (\d+)', sim.metrics())
    return int(match.group(1)) if match else 0


def test_by_default_the_server_cuts_a_call_at_the_clients_grpc_timeout(
    tmp_path: Path, sim_factory: Start
) -> None:
    sim = sim_factory(config=config(tmp_path), time_scale=500)
    stuck(sim)
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().AwaitProof(pb.AwaitProofRequest(job_id="stuck"), timeout=0.5)
    # Both timers fire at the same moment: whichever wins, the server ended its side too.
    assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
    poll_until(lambda: cuts(sim, "await") == 1, 5, what="the server-side cut counted")
    # A call without a deadline is never cut by the server.
    future = sim.stub().AwaitProof.future(pb.AwaitProofRequest(job_id="stuck"))
    with pytest.raises(grpc.FutureTimeoutError):
        future.result(timeout=1.0)
    future.cancel()
    assert cuts(sim, "await") == 1


def test_cancel_early_answers_cancelled_timeout_expired_before_the_clients_deadline(
    tmp_path: Path, sim_factory: Start
) -> None:
    # The server's deadline 4.5 s before ours (5 s): it cuts 0.5 s in, so far ahead of ours
    # that no scheduling delay can reorder the two.
    deadline_s, lead_s = 5.0, 4.5
    args = ["--fault", f"cancel-early:{lead_s:g}"]
    sim = sim_factory(config=config(tmp_path), time_scale=500, args=args)
    stuck(sim)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        sim.stub().AwaitProof(pb.AwaitProofRequest(job_id="stuck"), timeout=deadline_s)
    elapsed = time.monotonic() - started
    # The server's cut, before our deadline (ours would say DEADLINE_EXCEEDED) ...
    assert err.value.code() == grpc.StatusCode.CANCELLED
    assert err.value.details() == "Timeout expired"
    # ... and not a margin: it came no sooner than our deadline less its lead (the deadline
    # reaches it as the time left when the call was sent, a few ms less than ours).
    assert elapsed >= 0.9 * (deadline_s - lead_s)
    assert cuts(sim, "await") == 1


def test_cancel_cuts_the_named_call_once(tmp_path: Path, sim_factory: Start) -> None:
    faults = ["cancel:await", "cancel:submit-before", "cancel:submit-after", "cancel:metrics"]
    sim = sim_factory(
        config=config(tmp_path),
        time_scale=2000,
        args=[arg for fault in faults for arg in ("--fault", fault)],
    )
    stub = sim.stub()
    # The first SubmitProof is cut before it lands (no job), the second after (a job).
    for job_id in ("before", "after"):
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitProof(submit_request(job_id), timeout=5)
        assert (err.value.code(), err.value.details()) == (
            grpc.StatusCode.CANCELLED,
            "Timeout expired",
        )
    with pytest.raises(grpc.RpcError) as err:
        stub.GetMetrics(pb.GetMetricsRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.CANCELLED
    text = sim.metrics()  # only once
    assert 'request_id="before"' not in text
    assert 'cuzk_sim_submissions_total{request_id="after"} 1' in text
    with pytest.raises(grpc.RpcError) as err:
        stub.AwaitProof(pb.AwaitProofRequest(job_id="after"), timeout=5)
    assert err.value.code() == grpc.StatusCode.CANCELLED
    done = stub.AwaitProof(pb.AwaitProofRequest(job_id="after"), timeout=10)
    assert done.status == pb.AwaitProofResponse.COMPLETED
    with pytest.raises(grpc.RpcError) as err:
        stub.AwaitProof(pb.AwaitProofRequest(job_id="before"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_freeze_silences_open_connections_for_good_and_new_ones_only_in_its_window(
    tmp_path: Path, sim_factory: Start
) -> None:
    # 100 simulated seconds at scale 500: a 0.2 s window, starting 0.5 s after the bind.
    sim = sim_factory(
        config=config(tmp_path), time_scale=500, args=["--fault", "freeze:100,after_s=0.5"]
    )
    with grpc.insecure_channel(sim.target) as old:
        stub = pb_grpc.ProvingEngineStub(old)
        assert stub.GetStatus(pb.GetStatusRequest(), timeout=2).gpus  # connected, answered
        sim.wait_for_line("froze client connections")
        # The open connection is silent: not even the server's own deadline answer gets out.
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as err:
                stub.GetStatus(pb.GetStatusRequest(), timeout=0.5)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # A new connection after the window is answered at once: the daemon itself is fine
        # (unlike `hang`, after which no connection is ever answered).
        with grpc.insecure_channel(
            sim.target, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as fresh:
            status = pb_grpc.ProvingEngineStub(fresh).GetStatus(pb.GetStatusRequest(), timeout=2)
            assert status.gpus
        with pytest.raises(grpc.RpcError) as err:
            stub.GetStatus(pb.GetStatusRequest(), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # still frozen
