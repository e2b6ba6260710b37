"""The field's rough edges in the simulated daemon (issue 32): connections reset again and again
(``--chaos-resets``), synthesis that slows once the daemon has completed some proofs
(``--throttle``)."""

from __future__ import annotations

import argparse
import asyncio

from simhelpers import SimProcess, free_tcp_port, write_config

from cuzk_supervisor.sim.daemon import chaos, logfmt
from cuzk_supervisor.sim.daemon.main import build_parser


def args_of(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_arguments_parse_and_bad_ones_are_named():
    args = args_of("--chaos-resets", "0.2:2", "--chaos-seed", "4", "--throttle", "1.1:6")
    assert chaos.problem(args) is None
    assert chaos.parse_pair(args.chaos_resets, "x") == (0.2, 2.0)
    assert args.chaos_seed == 4
    assert "out of range" in (chaos.problem(args_of("--chaos-resets", "2:0.2")) or "")
    assert "expected A:B" in (chaos.problem(args_of("--throttle", "fast")) or "")
    assert chaos.problem(args_of()) is None


def test_a_throttle_fires_once_at_its_count():
    slowed: list[float] = []
    throttle = chaos.Throttle(1.1, 6, slowed.append, logfmt.DaemonLog("error"))
    for completed in range(1, 10):
        throttle.check(completed)
    assert slowed == [1.1]
    assert throttle.fired


def test_connection_chaos_resets_again_and_again_with_its_seed():
    async def main() -> list[int]:
        drops: list[int] = []
        done = asyncio.Event()

        def drop() -> int:
            drops.append(len(drops))
            if len(drops) >= 5:
                done.set()
            return 1

        args = args_of("--chaos-resets", "0.001:0.002", "--chaos-seed", "1")
        resets = chaos.ConnectionChaos.of(args, drop, logfmt.DaemonLog("error"))
        assert resets is not None
        assert resets.task is not None
        try:
            await asyncio.wait_for(done.wait(), 30)  # only a hang reaches this
        finally:
            resets.task.cancel()
        return drops

    assert len(asyncio.run(main())) >= 5
    assert chaos.ConnectionChaos.of(args_of(), lambda: 0, logfmt.DaemonLog("error")) is None


def test_an_invalid_chaos_argument_stops_the_daemon_with_its_reason(tmp_path):
    config = write_config(tmp_path)
    sim = SimProcess.start(listen=f"127.0.0.1:{free_tcp_port()}", config=config,
                           args=["--throttle", "0:6"], ready=False)  # fmt: skip
    try:
        assert sim.wait(20) == 1
    finally:
        sim.kill()
