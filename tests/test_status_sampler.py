"""adapters.proving.statussampler: the daemon's HTTP status sampled during the bench."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from simhelpers import free_tcp_port

from cuzk_supervisor.adapters.proving.statussampler import (
    StatusSampler,
    fetch_status,
    parse_status,
)
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.sim.chaos import HangGate
from cuzk_supervisor.sim.status_http import start_status_server

DOCUMENT: dict[str, Any] = {
    "uptime_secs": 10,
    "synthesis": {"max_concurrent": 5, "active": 3},
    "pipelines": [
        {
            "job_id": "a", "proof_kind": "porep-c2", "started_secs_ago": 3,
            "total_partitions": 10, "partitions_done": 1,
            "partitions": [
                {"index": 0, "state": "done", "synth_ms": 30400, "gpu_ms": 3000},
                {"index": 1, "state": "synth_done", "synth_ms": 30400, "gpu_ms": None},
                {"index": 2, "state": "synthesizing", "synth_ms": None, "gpu_ms": None},
                "junk",
            ],
        },
        "junk",
    ],
    "gpu_workers": [
        {"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "a",
         "current_partition": 1, "busy_secs": 3.0},
        {"worker_id": 1, "gpu_ordinal": 0, "state": "idle", "current_job": None,
         "current_partition": None, "busy_secs": 0.0},
    ],
}  # fmt: skip


def test_parse_status_reads_the_daemons_shape() -> None:
    sample = parse_status(DOCUMENT, 12.5, cpu_busy_share=0.4)
    assert sample is not None
    assert (sample.at, sample.synth_max, sample.synth_active) == (12.5, 5, 3)
    (pipeline,) = sample.pipelines
    assert (pipeline.job_id, pipeline.total_partitions) == ("a", 10)
    assert [p.state for p in pipeline.partitions] == ["done", "synth_done", "synthesizing"]
    assert pipeline.partitions[0].synth_ms == 30400
    assert pipeline.partitions[1].gpu_ms is None
    assert [w.proving for w in sample.gpu_workers] == [True, False]
    assert sample.cpu_busy_share == 0.4
    assert sample.count("synth_done") == 1


def test_the_simulators_cpu_replaces_ours() -> None:
    sim = {**DOCUMENT, "sim": {"cpu_busy_share": 0.97}}
    assert parse_status(sim, 0.0, cpu_busy_share=0.1).cpu_busy_share == 0.97  # type: ignore[union-attr]
    unknown = {**DOCUMENT, "sim": {"cpu_busy_share": None}}
    assert parse_status(unknown, 0.0, cpu_busy_share=0.1).cpu_busy_share is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "document",
    [None, [], "x", {}, {"synthesis": "no"}],
)
def test_what_is_not_a_status_gives_no_sample(document: object) -> None:
    assert parse_status(document, 0.0) is None


def test_odd_values_are_left_out_not_fatal() -> None:
    odd = {"synthesis": {"max_concurrent": True, "active": -2}, "pipelines": None,
           "gpu_workers": [{"state": "proving", "worker_id": "x"}]}  # fmt: skip
    sample = parse_status(odd, 0.0)
    assert sample is not None
    assert (sample.synth_max, sample.synth_active) == (0, 0)
    assert sample.gpu_workers[0].worker_id == 0
    assert sample.gpu_workers[0].proving


async def test_sampling_collects_samples_from_a_live_listener() -> None:
    port = free_tcp_port()
    address = parse_address(f"127.0.0.1:{port}")
    calls: list[int] = []

    def document() -> dict[str, Any]:
        calls.append(1)
        return DOCUMENT

    server = await start_status_server(address, document, HangGate())
    try:
        assert await fetch_status(address) == DOCUMENT
        sampler = StatusSampler(f"127.0.0.1:{port}", 0.02, cpu=lambda: 0.5)
        async with sampler.sampling() as samples:
            await asyncio.sleep(0.3)
        count = len(samples)
        assert 5 <= count <= 16
        await asyncio.sleep(0.1)
        assert len(samples) == count  # stopped with the block
        assert all(s.cpu_busy_share == 0.5 for s in samples)
        assert [s.at for s in samples] == sorted(s.at for s in samples)
    finally:
        server.close()
        await server.wait_closed()


async def test_nobody_listening_gives_no_samples_and_no_error() -> None:
    port = free_tcp_port()
    assert await fetch_status(parse_address(f"127.0.0.1:{port}"), 0.2) is None
    sampler = StatusSampler(f"127.0.0.1:{port}", 0.02)
    async with sampler.sampling() as samples:
        await asyncio.sleep(0.1)
    assert samples == []


async def test_a_404_is_no_document() -> None:
    port = free_tcp_port()
    reader_writer: list[Any] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reader_writer.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    try:
        assert await fetch_status(parse_address(f"127.0.0.1:{port}")) is None
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
