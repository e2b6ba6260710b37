"""Many proofs at once: :func:`run_batch` runs copies of one request, at most ``concurrency``
at a time, over any :class:`Prover` (the proving client, or a fake in tests).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Protocol

from cuzk_supervisor.adapters.proving.results import BatchResult, ProofResult, summarize_batch
from cuzk_supervisor.proto import proving_pb2 as pb


class Prover(Protocol):
    async def prove(
        self, request: pb.SubmitProofRequest, budget_s: float | None = None
    ) -> ProofResult: ...


async def run_batch(
    prover: Prover,
    template: pb.SubmitProofRequest,
    count: int,
    concurrency: int,
    *,
    budget_s: float | None = None,
    on_result: Callable[[int, ProofResult], None] | None = None,
) -> BatchResult:
    """Run ``count`` proofs of ``template``, at most ``concurrency`` at once, the next as soon
    as one finishes; ``budget_s`` applies to each, ``on_result(index, result)`` as each ends.
    Each is a copy with its own uuid4 ``request_id`` (the template's is ignored: the daemon does
    not de-duplicate, and every proof must be a distinct job)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    results: list[ProofResult | None] = [None] * count
    indices = iter(range(count))

    async def worker() -> None:
        # One shared iterator: a worker takes the next index the moment its proof ends.
        for index in indices:
            request = pb.SubmitProofRequest()
            request.CopyFrom(template)
            request.request_id = str(uuid.uuid4())
            result = await prover.prove(request, budget_s)
            results[index] = result
            if on_result is not None:
                on_result(index, result)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, count)):
            group.create_task(worker())
    done = tuple(r for r in results if r is not None)
    return BatchResult(results=done, summary=summarize_batch(done, concurrency))
