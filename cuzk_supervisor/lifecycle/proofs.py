"""Proof attempts: one proof (warmup, settle) tried under a retry policy, and a bench stretch.

Proof work runs *watched*: critical memory or an OOM kill interrupts it as :class:`MemoryTrouble`
(the phase machine steps down), a daemon exit as :class:`DaemonRestarted` (its jobs are lost with
it), a keeper that gave up as the keeper's :class:`LifecycleFailure`. The daemon is only reached
through a client from ``client_factory`` (a gRPC ``ProvingClient``; tests pass their own).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import structlog
from tenacity import RetryCallState, retry_if_result

from cuzk_supervisor import exitcodes
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.proving.batch import Prover
from cuzk_supervisor.adapters.proving.proofinput import build_submit_request, load_c1
from cuzk_supervisor.adapters.proving.results import ProofResult
from cuzk_supervisor.adapters.proving.statussampler import StatusSampler
from cuzk_supervisor.core.bench import BenchPolicy, Stretch, planned_proofs
from cuzk_supervisor.core.bound import StatusSample
from cuzk_supervisor.daemon.keeper import KeeperOutcome
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.lifecycle.benchrun import StretchRun
from cuzk_supervisor.lifecycle.looplag import LoopLag
from cuzk_supervisor.lifecycle.retries import Retry
from cuzk_supervisor.lifecycle.shared import (
    DaemonRestarted,
    LifecycleFailure,
    MemoryTrouble,
    Progress,
    Signals,
    cancel_and_wait,
)
from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.serve.metricsink import MetricsSink

log = structlog.get_logger()
T = TypeVar("T")

ClientFactory = Callable[[], AbstractAsyncContextManager[Prover]]


class DaemonWatch(Protocol):
    """What proof work needs of the daemon control."""

    @property
    def ended(self) -> asyncio.Future[KeeperOutcome]: ...

    async def ready(self) -> None: ...


@dataclass(eq=False, kw_only=True)
class ProofRunner:
    daemon: DaemonWatch
    client_factory: ClientFactory
    c1_file: Path
    signals: Signals
    progress: Progress
    metrics: MetricsSink
    shipper: LogShipper
    retry: Retry
    proof_budget_s: float | None
    rate_time_scale: float
    loop_lag: Callable[[], LoopLag] = LoopLag
    status_sampler: StatusSampler | None = None
    _request: pb.SubmitProofRequest | None = field(default=None, init=False)

    # --- one proof ----------------------------------------------------------------------------

    async def prove(self, budget_s: float) -> ProofResult:
        """One proof, tried under the proof retry policy; memory trouble propagates."""
        attempts = self.retry.attempts

        def failed(state: RetryCallState) -> None:
            result: ProofResult = state.outcome.result()  # type: ignore[union-attr]
            log.warning("proof.attempt_failed", attempt=state.attempt_number, of=attempts,
                        status=str(result.status), reason=result.error)  # fmt: skip

        retrying = self.retry.controller(
            retry_if_result(lambda result: not result.ok),
            after=failed,
            retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
        )
        result: ProofResult = await retrying(self._attempt, budget_s)
        if result.ok:
            return result
        raise LifecycleFailure(
            exitcodes.BENCH_FAILED,
            f"{self.progress.phase} proof failed {attempts} times; last: {result.error}",
        )

    async def _attempt(self, budget_s: float) -> ProofResult:
        """One attempt: submitted again, not counted again, when the daemon restarts under it
        (a crash loop ends in the keeper's verdict, which the watch raises)."""
        while True:
            try:
                result = await self._watched(
                    lambda client: client.prove(self.c1_request(), budget_s)
                )
                break
            except DaemonRestarted as restart:
                log.warning("proof.daemon_restarted", phase=self.progress.phase,
                            cause=restart.cause)  # fmt: skip
                await self.daemon.ready()
        self.metrics.proof_finished(result.ok, result.wall_s)
        if result.ok:
            self.progress.proofs_done += 1
        else:
            self.progress.proofs_failed += 1
            self.progress.last_failure = (
                f"{self.progress.phase} proof {result.status}: {result.error}"
            )
        return result

    # --- a bench stretch ----------------------------------------------------------------------

    async def stretch(
        self, policy: BenchPolicy, workers: int, deadline: Callable[[], float]
    ) -> Stretch:
        """One stretch; a daemon restart under it ends it as interrupted (its completions kept).
        Memory trouble propagates, the stretch so far left in ``progress.stretch``."""
        run = StretchRun(policy, workers, deadline, daemon_seconds_per_second=self.rate_time_scale)
        progress = self.progress
        progress.stretch = run.stretch
        progress.bench_planned = policy.max_proofs
        shipper = self.shipper
        log.info(
            "bench.started",
            concurrency=run.stretch.concurrency,
            max_proofs=policy.max_proofs,
            budget_left_s=round(deadline() - run.clock(), 1),
        )

        def on_result(index: int, result: ProofResult, stretch: Stretch) -> None:
            progress.stretch = stretch
            self.metrics.proof_finished(result.ok, result.wall_s)
            if result.ok:
                progress.proofs_done += 1
            else:
                progress.proofs_failed += 1
            progress.bench_planned = planned_proofs(stretch, policy)
            shipper.add_line(
                "benchout",
                f"proof {index + 1} of up to {progress.bench_planned} {result.status} "
                f"{result.wall_s:.2f}s {result.error}".rstrip(),
                milestone=not result.ok, kind="bench proof",
            )  # fmt: skip

        request = self.c1_request()
        sampler = self.status_sampler
        sampling: AbstractAsyncContextManager[list[StatusSample]] = (
            sampler.sampling() if sampler is not None else contextlib.nullcontext([])
        )
        # How late we ourselves woke while it ran; what the daemon's status said meanwhile.
        async with self.loop_lag() as lag, sampling as samples:
            try:
                stretch = await self._watched(
                    lambda client: run.run(client, request, self.proof_budget_s, on_result)
                )
            except DaemonRestarted as restart:
                stretch = run.stretch.interrupt(restart.cause)
                log.warning("bench.interrupted", cause=restart.cause,
                            completed=len(stretch.completions), lost=stretch.in_flight)  # fmt: skip
                shipper.add_line(
                    "benchout",
                    f"bench interrupted: {restart.cause}; {stretch.in_flight} proof(s) lost",
                    milestone=True,
                )
                await self.daemon.ready()
            except MemoryTrouble:
                progress.stretch = run.stretch
                raise
        progress.stretch = None
        progress.bench_samples = tuple(samples)
        done = stretch.completions
        progress.bench_window = (done[0], done[-1]) if len(done) >= 2 else None
        log.info("bench.stretch_done", submitted=stretch.submitted,
                 completed=len(stretch.completions), stopped=run.stop_reason,
                 loop_lag_max_ms=round(lag.worst_s * 1000, 1))  # fmt: skip
        return stretch

    def release_input(self) -> None:
        """Drop the submit request built from the C1 (the C1's size: 51 MB in the field, 99.6
        MiB of RSS in bench/run.py's run phase while kept). A later proof loads it again."""
        self._request = None

    # --- inside -------------------------------------------------------------------------------

    def c1_request(self) -> pb.SubmitProofRequest:
        if self._request is None:
            try:
                self._request = build_submit_request(load_c1(self.c1_file))
            except UsageError as exc:
                raise LifecycleFailure(exitcodes.USAGE, str(exc)) from None
        return self._request

    async def _watched(self, work: Callable[[Prover], Awaitable[T]]) -> T:
        """Run proof work, interrupted as the module docstring says."""
        keeper_task = self.daemon.ended
        signals = self.signals
        signals.daemon_exited.clear()
        async with self.client_factory() as client:
            job = asyncio.ensure_future(work(client))
            trouble = asyncio.ensure_future(signals.trouble.wait())
            exited = asyncio.ensure_future(signals.daemon_exited.wait())
            try:
                done, _ = await asyncio.wait(
                    {job, trouble, exited, keeper_task}, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:  # a signal: the proof ends with us
                await cancel_and_wait(job)
                raise
            finally:
                trouble.cancel()
                exited.cancel()
            if job in done:
                return job.result()
            await cancel_and_wait(job)
            if keeper_task.done():
                outcome = keeper_task.result()
                raise LifecycleFailure(outcome.exit_code, f"daemon: {outcome.reason}")
            if signals.trouble.is_set():
                raise MemoryTrouble(signals.trouble_cause)
            raise DaemonRestarted(signals.exit_cause or "daemon exited")
