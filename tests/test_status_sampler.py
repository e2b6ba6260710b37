"""The one reader of the daemon's HTTP status (adapters.proving.daemonstatus) and the bench's
sampler built on it (adapters.proving.statussampler)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from simhelpers import apoll_until, free_tcp_port

from cuzk_supervisor.adapters.proving.daemonstatus import (
    fetch_status,
    read_sample,
    status_address,
    synthesizing_now,
)
from cuzk_supervisor.adapters.proving.statussampler import StatusSampler, sampler_on
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.core.boundsample import parse_status
from cuzk_supervisor.sim.daemon.chaos import HangGate
from cuzk_supervisor.sim.daemon.status_http import start_status_server

DOCUMENT: dict[str, Any] = {
    "uptime_secs": 10.5,
    "synthesis": {"max_concurrent": 15, "active": 4},
    "pipelines": [
        {
            "job_id": "a", "proof_kind": "porep-c2", "started_secs_ago": 3.0,
            "total_partitions": 10, "partitions_done": 1,
            "partitions": [
                {"index": 0, "state": "done", "synth_ms": 30400, "gpu_ms": 3000},
                {"index": 1, "state": "synth_done", "synth_ms": 30400, "gpu_ms": None},
                {"index": 2, "state": "synthesizing", "synth_ms": 1200, "gpu_ms": None},
                "junk",
            ],
        },
        "junk",
    ],
    "gpu_workers": [
        {"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "a",
         "current_partition": 1, "busy_secs": 3.0},
        {"worker_id": 1, "gpu_ordinal": 0, "state": "idle", "current_job": None,
         "current_partition": None, "busy_secs": None},
    ],
}  # fmt: skip


def test_parse_status_reads_the_daemons_shape() -> None:
    sample = parse_status(DOCUMENT, 12.5, cpu_busy_share=0.4)
    assert sample is not None
    assert (sample.at, sample.synth_max, sample.synth_active) == (12.5, 15, 4)
    (pipeline,) = sample.pipelines
    assert (pipeline.job_id, pipeline.total_partitions) == ("a", 10)
    assert [p.state for p in pipeline.partitions] == ["done", "synth_done", "synthesizing"]
    assert [w.proving for w in sample.gpu_workers] == [True, False]
    assert sample.gpu_workers[0].current_job == "a"
    assert sample.cpu_busy_share == 0.4
    # active says 4, one partition synthesizes: 3 leaked by failed syntheses.
    assert (sample.synthesizing, sample.leaked_active) == (1, 3)
    assert sample.count("synth_done") == 1


def test_the_simulators_machine_replaces_ours() -> None:
    sim = {**DOCUMENT, "sim": {"cpu_busy_share": 0.97, "gpus": [{"index": 0, "utilisation": 0.3}]}}
    sample = parse_status(sim, 0.0, cpu_busy_share=0.1)
    assert sample is not None
    assert sample.cpu_busy_share == 0.97
    assert [(g.index, g.utilisation) for g in sample.gpus] == [(0, 0.3)]
    unknown = parse_status({**DOCUMENT, "sim": {"cpu_busy_share": None}}, 0.0, 0.1)
    assert unknown is not None
    assert unknown.cpu_busy_share is None


@pytest.mark.parametrize("document", [None, [], "x", {}, {"synthesis": "no"}])
def test_what_is_not_a_status_gives_no_sample(document: object) -> None:
    assert parse_status(document, 0.0) is None


def test_odd_values_are_left_out_not_fatal() -> None:
    worker = {"state": "proving", "worker_id": "x", "busy_secs": "soon"}
    odd = {"synthesis": {"max_concurrent": True, "active": -2}, "pipelines": None,
           "gpu_workers": [worker]}  # fmt: skip
    sample = parse_status(odd, 0.0)
    assert sample is not None
    assert (sample.synth_max, sample.synth_active) == (0, 0)
    assert (sample.gpu_workers[0].worker_id, sample.gpu_workers[0].busy_secs) == (0, None)


@pytest.mark.parametrize(
    ("listen", "found"),
    [("127.0.0.1:9821", True), ("", False), ("not an address", False),
     ("unix:///run/status.sock", False)],  # the daemon's listener is TCP only
)  # fmt: skip
def test_status_address(listen: str, found: bool) -> None:
    assert (status_address(listen) is not None) is found
    assert sampler_on(listen, 0.5) is found
    assert not sampler_on(listen, 0.0)


async def test_one_reader_for_the_sampler_the_live_line_and_the_step_down() -> None:
    port = free_tcp_port()
    address = parse_address(f"127.0.0.1:{port}")
    server = await start_status_server(address, lambda: DOCUMENT, HangGate())
    try:
        assert await fetch_status(address) == DOCUMENT
        sample = await read_sample(address, 3.0)
        assert sample is not None
        assert sample.partitions_by_job() == {"a": (1, 3)}
        # The step-down's count: partitions synthesizing by their states, not active's 4.
        assert await asyncio.to_thread(synthesizing_now, f"127.0.0.1:{port}") == 1
        clock = itertools.count(100.0)
        sampler = StatusSampler(f"127.0.0.1:{port}", 0.01, clock=lambda: next(clock),
                                cpu=lambda: 0.5)  # fmt: skip
        async with sampler.sampling() as samples:
            await apoll_until(lambda: asyncio.sleep(0, len(samples) >= 3), 30, what="3 samples")
        count = len(samples)
        assert count >= 3
        assert all(s.cpu_busy_share == 0.5 for s in samples)
        assert [s.at for s in samples] == sorted(s.at for s in samples)
    finally:
        server.close()
        await server.wait_closed()
    await asyncio.sleep(0)
    assert len(samples) == count  # stopped with the block


async def test_nobody_listening_gives_nothing_and_no_error() -> None:
    port = free_tcp_port()
    assert await fetch_status(parse_address(f"127.0.0.1:{port}"), 0.2) is None
    assert await asyncio.to_thread(synthesizing_now, f"127.0.0.1:{port}", 0.2) is None
    sampler = StatusSampler(f"127.0.0.1:{port}", 0.02, cpu=lambda: None)
    assert await sampler.sample_once() is None


async def test_a_404_or_an_answer_over_the_cap_is_no_document() -> None:
    port = free_tcp_port()
    body = b'{"synthesis": {"max_concurrent": 1, "active": 0}, "pad": "' + b"x" * 4096 + b'"}'
    answers = [b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 200 OK\r\n\r\n" + body]  # fmt: skip

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.pop(0))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    address = parse_address(f"127.0.0.1:{port}")
    try:
        assert await fetch_status(address) is None
        assert await fetch_status(address, max_bytes=1024) is None
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("listen", "interval"), [("127.0.0.1:9821", 0.0), ("", 0.5),
                                                  ("not an address", 0.5)])  # fmt: skip
async def test_off_when_no_interval_or_no_address(listen: str, interval: float) -> None:
    sampler = StatusSampler(listen, interval)
    assert not sampler.enabled
    assert await sampler.sample_once() is None
    async with sampler.sampling() as samples:
        pass
    assert samples == []
