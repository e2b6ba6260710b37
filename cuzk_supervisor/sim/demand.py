"""``python -m cuzk_supervisor.sim.demand``: production-like demand for the run phase (issue 34).

In production the fleet's proofs come from curio, a worker command beside the daemon: in
bursts, with hours of nothing between. This stands in for it: it follows a pattern of busy and
idle stretches in the daemon's (simulated) time, keeping ``@N`` proofs in flight through a busy
stretch and submitting nothing through an idle one, over and over. Each proof is one ``Prove``
call with the C1 file's request; a proof the daemon lost (it restarted: the call fails) is
tried again after a short pause, as curio retries. One line per proof on stdout (the ``curio``
tab), and one per stretch.

    python -m cuzk_supervisor.sim.demand --listen 127.0.0.1:9820 --c1 c1.json \\
        --time-scale 200 --pattern busy:2h@2,idle:4h

``--pattern`` is ``busy:DURATION@N`` and ``idle:DURATION`` stretches, comma-separated, each
DURATION ``45s``, ``30m`` or ``2h`` of the daemon's time (``--time-scale`` daemon seconds a real
second, as the simulated daemon's). ``--cycles`` ends it after that many passes (0: never).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from cuzk_supervisor.adapters.proving.proofinput import build_submit_request, load_c1
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

MAX_MESSAGE_BYTES = 128 * 1024 * 1024
RETRY_PAUSE_S = 0.5
"""Real seconds before a proof the daemon did not take is tried again."""
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_STRETCH = re.compile(r"^(busy|idle):(\d+(?:\.\d+)?)([smh])(?:@(\d+))?$")


@dataclass(frozen=True, slots=True)
class Stretch:
    busy: bool
    seconds: float
    """In the daemon's time."""
    concurrency: int = 0


def parse_pattern(text: str) -> tuple[Stretch, ...]:
    """``busy:2h@2,idle:4h`` to its stretches; UsageError for one that does not parse."""
    stretches = []
    for item in (part.strip() for part in text.split(",")):
        match = _STRETCH.match(item)
        if match is None:
            raise UsageError(f"demand pattern: {item!r} is not busy:DURATION@N or idle:DURATION")
        kind, amount, unit, count = match.groups()
        busy = kind == "busy"
        if busy != (count is not None) or (busy and int(count) < 1):
            raise UsageError(f"demand pattern: {item!r}: busy takes @N (N >= 1), idle none")
        stretches.append(Stretch(busy, float(amount) * _UNITS[unit], int(count or 0)))
    return tuple(stretches)


class Demand:
    def __init__(self, target: str, request: pb.SubmitProofRequest, time_scale: float) -> None:
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]  # fmt: skip
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.ProvingEngineStub(self._channel)
        self._request = request
        self._scale = time_scale
        self.completed = 0
        self.failed = 0
        self._seq = 0

    def say(self, text: str) -> None:
        sys.stdout.write(f"demand: {text}\n")
        sys.stdout.flush()

    async def run(self, pattern: Sequence[Stretch], cycles: int) -> None:
        cycle = 0
        while cycles <= 0 or cycle < cycles:
            cycle += 1
            self.say(f"cycle {cycle} ({self.completed} completed, {self.failed} failed so far)")
            for stretch in pattern:
                real_s = stretch.seconds / self._scale
                if stretch.busy:
                    self.say(f"busy for {stretch.seconds:g} s at {stretch.concurrency} in flight")
                    await self._busy(real_s, stretch.concurrency)
                else:
                    self.say(f"idle for {stretch.seconds:g} s")
                    await asyncio.sleep(real_s)
        await self._channel.close()

    async def _busy(self, real_s: float, concurrency: int) -> None:
        until = time.monotonic() + real_s
        await asyncio.gather(*(self._keep_one(until) for _ in range(concurrency)))

    async def _keep_one(self, until: float) -> None:
        """Proofs one after another until the stretch ends (the last one finishes)."""
        while time.monotonic() < until:
            await self._prove_one()

    async def _prove_one(self) -> None:
        self._seq += 1
        request = pb.SubmitProofRequest()
        request.CopyFrom(self._request)
        request.request_id = f"demand-{self._seq}-{time.monotonic_ns()}"
        try:
            answer = await self._stub.Prove(pb.ProveRequest(submit=request))
        except grpc.aio.AioRpcError as exc:
            self.say(f"proof {request.request_id} not taken: {exc.code().name}")
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        result = answer.result
        if result.status == pb.AwaitProofResponse.COMPLETED:
            self.completed += 1
            self.say(f"proof {request.request_id} completed in {result.total_ms} ms")
        else:
            self.failed += 1
            self.say(f"proof {request.request_id} failed: {result.error_message}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cuzk_supervisor.sim.demand",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--listen", required=True, help="the daemon's ip:port or unix:///path")
    p.add_argument("--c1", type=Path, required=True, help="the C1 file each proof proves")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--pattern", default="busy:2h@2,idle:4h")
    p.add_argument("--cycles", type=int, default=0)
    args = p.parse_args(argv)
    try:
        pattern = parse_pattern(args.pattern)
        target = parse_address(args.listen).grpc_target()
        request = build_submit_request(load_c1(args.c1))
    except UsageError as exc:
        sys.stderr.write(f"demand: {exc}\n")
        return 2
    if not args.time_scale > 0:
        sys.stderr.write("demand: --time-scale must be > 0\n")
        return 2
    asyncio.run(_run(target, request, args.time_scale, pattern, args.cycles))
    return 0


async def _run(
    target: str,
    request: pb.SubmitProofRequest,
    scale: float,
    pattern: Sequence[Stretch],
    cycles: int,
) -> None:
    """In the loop: grpc.aio binds a channel to the loop it is made in."""
    await Demand(target, request, scale).run(pattern, cycles)


if __name__ == "__main__":
    sys.exit(main())
