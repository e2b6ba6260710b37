"""The await loop of ``test_keepalive_strict.py``, on a scaled clock or in real time.

grpc-core's ping policy counts real time: a ping less than 5 min after the last one is a strike.
The client pings after 6 min of a call's silence and cuts each await at 30 s, so a loop longer
than one keepalive interval (400 s) shows whether the two agree. Every one of those figures
divided by the same ``scale`` (the server's floor by the simulator's ``--keepalive-scale``, the
client's by :meth:`Keepalive.scaled` and its await deadline by hand) keeps their ratios, so the
suite checks the same thing in ``400 / scale`` seconds (:data:`SCALE`).

Run as a script, ``python tests/keepaliveprobe.py [--scale F] FOLDER`` runs the loop (default: the
full 400 s in real time, scale 1) and writes ``FOLDER/result.json``: the check against the real
policy's own figures, for when the client's keepalive changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the helpers

from simhelpers import SimProcess, free_tcp_port, submit_request, write_config

LOOP_S = 400.0
"""Real seconds of the unscaled loop: past one client keepalive interval (360 s)."""
AWAIT_DEADLINE_S = 30.0
"""The client's default await deadline (ProvingTimeouts.await_deadline_s)."""
SCALE = 30.0
"""The suite's scale: a 13 s loop, pings after 12 s against a 10 s floor, 1 s awaits."""


async def await_loop(listen: str, scale: float) -> dict[str, Any]:
    """Await a job that never ends for ``LOOP_S / scale`` seconds with the client's keepalive
    and await deadline divided by ``scale``; what happened, as plain data."""
    from structlog.testing import capture_logs

    from cuzk_supervisor.adapters.proving.channel import Keepalive
    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
    from cuzk_supervisor.address import parse_address

    timeouts = ProvingTimeouts(await_deadline_s=AWAIT_DEADLINE_S / scale)
    with capture_logs() as events:
        async with ProvingClient(
            parse_address(listen), timeouts, keepalive=Keepalive().scaled(scale)
        ) as client:
            started = time.monotonic()
            result = await client.prove(submit_request("loop"), budget_s=LOOP_S / scale)
            elapsed = time.monotonic() - started
    retries = [e for e in events if e.get("event") == "proof.await_retry"]
    return {
        "elapsed_s": elapsed,
        "status": result.status.name,
        "retry_codes": [str(e.get("code")) for e in retries],
        "events_text": " ".join(str(e) for e in events),
    }


@contextlib.contextmanager
def stuck_sim(work: Path, scale: float = 1.0) -> Iterator[SimProcess]:
    """A strict-keepalive sim (its floor divided by ``scale``) whose jobs never end (workers
    stopped after "stuck" arrived)."""
    config = write_config(work, synthesis={"partition_workers": 1}, srs={"param_cache": str(work)})
    sim = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}",
        config=config,
        args=["--strict-keepalive", "--keepalive-scale", f"{scale:g}"],
    )
    try:
        assert f"keepalive=strict/{scale:g}" in sim.wait_for_line("simulator settings")
        sim.stub().SubmitProof(submit_request("stuck"), timeout=5)
        sim.send(signal.SIGINT)
        sim.wait_for_line("stopping engine workers")
        yield sim
    finally:
        sim.kill()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    work = args.folder / "sim"
    work.mkdir(parents=True)
    with stuck_sim(work, args.scale) as sim:
        outcome = asyncio.run(await_loop(sim.listen, args.scale))
    (args.folder / "result.json").write_text(json.dumps(outcome))
    print(json.dumps({k: v for k, v in outcome.items() if k != "events_text"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
