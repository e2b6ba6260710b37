"""The machinery of ``bench/fleet.py``: virtual machines running the product's own manager-facing
code in one process on scaled time, and a record of every request they make.

A :class:`VirtualMachine` is built from the supervisor's own pieces, wired as the composition root
(``cuzk_supervisor.compose``) wires them: the :class:`ManagerClient` (its timeouts, retry and log
shipper settings made from ``Settings`` by ``settings.policies.policy``), the durable
:class:`Outbox` on a :class:`StateKeeper`, the :class:`LogShipper` fed by the structlog events
of this machine (the product's ``shipping_processor``) and by a quiet daemon's output through
the product's :class:`OutputPump`, the :class:`Reporter` (register, the reports, the outbox
task, the kill look-ups, the ``/running`` ping) and the :class:`Monitors` loops (the status
line and what it asks of the manager). Only what never talks to the manager is a stand-in: the
daemon (a line now and then), the memory watch and the GPUs (nothing to say), the proofs (a
phase is a sleep) and the state file (kept in memory: the keeper is the product's, the disk is
not).

The one thing added on the way: each machine's HTTP transport is wrapped to record every
request (virtual start and end, path, status, bytes both ways, ``Retry-After``) and to note a
request made before an earlier answer's ``Retry-After`` had passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import email.utils
import inspect
import logging
import random
import ssl
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import _clockpatch  # first of the non-stdlib imports: it scales the clocks they bind
import httpx
import structlog

from cuzk_supervisor.adapters.logship.lines import shipping_processor
from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.machine.gpu import StaticProbe
from cuzk_supervisor.adapters.manager.client import ManagerClient
from cuzk_supervisor.adapters.manager.outbox import Outbox
from cuzk_supervisor.adapters.manager.values import ManagerRetry, ManagerTimeouts
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState
from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore
from cuzk_supervisor.core.reports import OUTCOME_OK
from cuzk_supervisor.core.risk import RiskLevel
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.lifecycle.monitors import Monitors
from cuzk_supervisor.lifecycle.reporting import Reporter
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.serve.metricsink import NoMetrics
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy

CLOCK = _clockpatch.CLOCK
# The phases between params and report, in the phase machine's order; the bench's share of the
# time is the last one's.
MIDDLE_PHASES = ("plan", "warmup", "restart", "settle", "bench")
MIDDLE_SHARES = (0.02, 0.3, 0.05, 0.13, 0.5)
EARLY_TOLERANCE_S = 0.5  # a request this close to its Retry-After is not called early


# --- the request record ---------------------------------------------------------------------------


@dataclass(slots=True)
class Request:
    """One request as a machine made it (virtual seconds)."""

    machine: int
    cohort: str
    start: float
    end: float
    method: str
    path: str
    status: int  # 0: no answer (refused, timed out, dropped)
    bytes_out: int  # what the machine sent (request line, headers, body)
    bytes_in: int  # what it received (status line, headers, body)
    retry_after: float | None = None  # seconds asked for by a 429/503
    early: bool = False  # made before an earlier answer's Retry-After had passed


@dataclass
class Recorder:
    """Every request of the fleet, in the order they ended."""

    requests: list[Request] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, request: Request) -> None:
        self.requests.append(request)


def retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds: a number, or an HTTP-date less the answer's own ``Date`` (so
    the manager's clock and ours need not agree); None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
        date = response.headers.get("date")
        base = email.utils.parsedate_to_datetime(date).timestamp() if date else CLOCK.time()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - base)


def _request_bytes(request: httpx.Request) -> int:
    line = len(request.method) + len(request.url.raw_path) + len(" HTTP/1.1\r\n") + 1
    headers = sum(len(k) + len(v) + 4 for k, v in request.headers.raw)
    return line + headers + 2 + len(request.content)


def _response_bytes(response: httpx.Response, body: bytes) -> int:
    line = len(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n")
    headers = sum(len(k) + len(v) + 4 for k, v in response.headers.raw)
    return line + headers + 2 + len(body)


class CountingTransport(httpx.AsyncBaseTransport):
    """One machine's transport: records each request, notes one made too early."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, recorder: Recorder, machine: int, cohort: str
    ) -> None:
        self._inner = inner
        self._recorder = recorder
        self._machine = machine
        self._cohort = cohort
        self.not_before = float("-inf")  # the latest Retry-After end of an answer received

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        start = CLOCK.monotonic()
        early = start < self.not_before - EARLY_TOLERANCE_S
        entry = Request(
            self._machine, self._cohort, start, start, request.method, request.url.path, 0, 0, 0
        )
        entry.early = early
        token = id(entry)
        _clockpatch.INFLIGHT[token] = _clockpatch.real_monotonic()  # the governor watches it
        try:
            response = await self._inner.handle_async_request(request)
            try:
                body = b"".join([part async for part in response.aiter_bytes()])
            finally:
                await response.aclose()
        except BaseException as exc:
            _clockpatch.INFLIGHT.pop(token, None)
            entry.end = CLOCK.monotonic()
            name = type(exc).__name__
            self._recorder.errors[name] = self._recorder.errors.get(name, 0) + 1
            if isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ConnectError):
                entry.bytes_out = _request_bytes(request)  # sent, no answer
            self._recorder.add(entry)
            raise
        _clockpatch.INFLIGHT.pop(token, None)
        entry.end = CLOCK.monotonic()
        entry.status = response.status_code
        entry.bytes_out = _request_bytes(request)
        entry.bytes_in = _response_bytes(response, body)
        if response.status_code in (429, 503):
            entry.retry_after = retry_after_s(response)
            if entry.retry_after is not None:
                self.not_before = max(self.not_before, entry.end + entry.retry_after)
        self._recorder.add(entry)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=httpx.ByteStream(body),
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- stand-ins for what never talks to the manager ---------------------------------------------


class QuietWatch:
    """The memory watch, with nothing to say (``Monitors`` reads ``last`` and ``level``)."""

    def __init__(self) -> None:
        self.last = None
        self.level = RiskLevel.OK
        self.assessment = None
        self.critical = asyncio.Event()

    async def run(self) -> None:
        await asyncio.Event().wait()


class NoRestarts:
    restarts = 0


class NoGpu(StaticProbe):
    """No GPU to watch: the GPU loop skips its sample (a thread hop per machine otherwise)."""

    available = False
    reason = "fleet bench: no GPUs"


class MemoryStateStore(StateStore):
    """The state file kept in memory: the keeper, its order and its copies are the product's."""

    def __init__(self) -> None:
        super().__init__("/nonexistent/fleet-bench-state.json")

    def load(self) -> SupervisorState:
        return SupervisorState()

    def save(self, state: SupervisorState) -> SupervisorState:
        return state


class MemoryStateKeeper(StateKeeper):
    """A keeper whose saves are made in the loop: no thread hop for a write to memory."""

    async def update(self, change: Callable[[SupervisorState], SupervisorState]) -> SupervisorState:
        async with self._lock:
            self._state = self.store.save(change(self._state))
            return self._state


def _optional(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes among ``kwargs`` (the seams a version offers)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


# --- one machine ---------------------------------------------------------------------------------


CURRENT: contextvars.ContextVar[VirtualMachine | None] = contextvars.ContextVar(
    "fleet_machine", default=None
)


def route_to_machine(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The structlog processor of the bench: each event goes to the shipper of the machine whose
    task logged it (the product's ``shipping_processor``), then is dropped (no terminal)."""
    machine = CURRENT.get()
    if machine is not None:
        machine.log_events += 1
        event_dict.setdefault("phase", machine.progress.phase)
        if machine.reporter.uuid:
            event_dict.setdefault("uuid", machine.reporter.uuid)
        machine.ship(logger, method_name, event_dict)
    raise structlog.DropEvent


def configure_logging() -> None:
    """As ``observe.configure_logging`` at level info, with the shipping processor per machine."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            route_to_machine,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.ReturnLoggerFactory(),
        cache_logger_on_first_use=False,
    )


@dataclass(frozen=True)
class Lifecycle:
    """How long the phases that do not talk to the manager take (virtual seconds), the rate
    reported, and the daemon's output in lines per minute."""

    params_s: float = 60.0
    middle_s: float = 120.0  # plan, warmup, restart, settle and bench together
    rate: float = 60.0
    min_rate: float = 30.0
    daemon_lines_per_min: float = 1.0


@dataclass
class Outcome:
    registered_at: float | None = None
    running_at: float | None = None
    verdict: bool | None = None  # the manager's pass/fail, None: none received
    bench_outcome: str | None = None  # the /bench-done report's outcome (ok, rejected, gone)
    gone: str | None = None
    error: str | None = None
    reports: list[Report] = field(default_factory=list)


class VirtualMachine:
    def __init__(
        self,
        index: int,
        cohort: str,
        settings: Settings,
        lifecycle: Lifecycle,
        recorder: Recorder,
        ssl_context: ssl.SSLContext,
        seed: int,
    ) -> None:
        self.index = index
        self.cohort = cohort
        self.label = f"C.{900_000_000 + index}"
        self.s = settings
        self.life = lifecycle
        self.outcome = Outcome()
        self.log_events = 0
        rng = random.Random(seed)
        self._rng = rng
        self.transport = CountingTransport(
            httpx.AsyncHTTPTransport(verify=ssl_context), recorder, index, cohort
        )
        seams = {"clock": CLOCK.monotonic, "wall_clock": CLOCK.time, "rng": random.Random(seed)}
        self.manager = ManagerClient(
            settings.manager_url,
            timeouts=policy(ManagerTimeouts, settings),
            retry=policy(ManagerRetry, settings),
            transport=self.transport,
            **_optional(ManagerClient.__init__, **seams),
        )
        self.shipper = LogShipper(
            self.manager if settings.log_push else None,
            policy(ShipperSettings, settings),
            **_optional(LogShipper.__init__, rng=random.Random(seed + 1), clock=CLOCK.monotonic),
        )
        self.ship = shipping_processor(self.shipper)
        self.keeper = MemoryStateKeeper(MemoryStateStore(), SupervisorState())
        self.progress, self.signals = Progress(), Signals()
        self.reporter = Reporter(
            settings,
            label=self.label,
            min_rate=lifecycle.min_rate,
            manager=self.manager,
            state=self.keeper,
            outbox=Outbox.for_keeper(self.manager, self.keeper),
            shipper=self.shipper,
            signals=self.signals,
            progress=self.progress,
            retries=LifecycleRetries(),
            **_optional(Reporter.__init__, **{**seams, "rng": random.Random(seed + 2)}),
        )
        self.manager.add_retry_listener(self.reporter.on_manager_retry)
        watch: Any = QuietWatch()
        daemon: Any = NoRestarts()
        self.monitors = Monitors(
            settings,
            progress=self.progress,
            signals=self.signals,
            watch=watch,
            gpu=NoGpu(),
            metrics=NoMetrics(),
            daemon=daemon,
            manager=self.reporter,
            **_optional(Monitors.__init__, clock=CLOCK.monotonic, rng=random.Random(seed + 3)),
        )
        self._pump = OutputPump("cuzk", None)
        self._pump.add_listener(self.shipper.listener("cuzk"))
        self._daemon_out = asyncio.StreamReader()

    # -- the run, as Lifecycle.run: the shipper, the monitors and the outbox task beside it --

    async def run(self, stop: asyncio.Event) -> None:
        CURRENT.set(self)
        try:
            async with asyncio.TaskGroup() as group:
                shipper_task = group.create_task(self.shipper.run())
                loops = [group.create_task(loop()) for loop in self.monitors.loops()]
                loops.append(group.create_task(self.reporter.outbox_loop()))
                loops.append(group.create_task(self._pump.pump(self._daemon_out, "stdout")))
                try:
                    await self._phases(stop)
                finally:
                    for task in loops:
                        task.cancel()
                    self.shipper.stop()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(shipper_task), 10)
        except Exception as exc:  # a bug or an unexpected answer: this machine's outcome
            self.outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.outcome.reports = [
                *self.reporter.outbox.pending,
                *self.reporter.outbox.acked,
            ]
            await self.manager.aclose()

    async def _enter(self, phase: str) -> None:
        await self.keeper.update(lambda st: dataclasses.replace(st, phase=phase))
        self.progress.phase = phase
        self.progress.phase_started = CLOCK.monotonic()
        structlog.get_logger().info("phase.entered", phase=phase)

    async def _phases(self, stop: asyncio.Event) -> None:
        life = self.life
        gone = asyncio.ensure_future(self.signals.gone.wait())
        try:
            await self.reporter.resend()
            await self._enter("register")
            await self.reporter.register()
            self.outcome.registered_at = CLOCK.monotonic()
            await self._enter("params")
            await self._sleep(life.params_s, gone)
            await self.reporter.params_done()
            daemon = asyncio.ensure_future(self._daemon_lines())
            try:
                for phase, share in zip(MIDDLE_PHASES, MIDDLE_SHARES, strict=True):
                    await self._enter(phase)
                    await self._sleep(life.middle_s * share, gone)
                await self._enter("report")
                self.shipper.add_line("benchout", f"rate={life.rate:.2f} proofs/h (fleet bench)")
                done = await self.reporter.bench_done(life.rate)
                self.outcome.bench_outcome = done.outcome
                self.outcome.verdict = done.passed if done.outcome == OUTCOME_OK else None
                if self.outcome.verdict is False:
                    return
                await self._enter("run")
                await self.reporter.running()
                self.outcome.running_at = CLOCK.monotonic()
                stopped = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({stopped, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopped.cancel()
            finally:
                daemon.cancel()
        except _Gone:
            pass
        except Exception:
            if not self.signals.gone.is_set():
                raise
        finally:
            gone.cancel()
            if self.signals.gone.is_set():
                self.outcome.gone = self.signals.gone_reason

    async def _sleep(self, seconds: float, gone: asyncio.Future[Any]) -> None:
        """A phase that does not talk to the manager; a kill ends it."""
        done, _ = await asyncio.wait({gone}, timeout=seconds)
        if done:
            raise _Gone

    async def _daemon_lines(self) -> None:
        """A quiet daemon: a line every so often (jittered), through the product's pump."""
        per_min = self.life.daemon_lines_per_min
        if per_min <= 0:
            return
        mean = 60.0 / per_min
        await asyncio.sleep(self._rng.uniform(0, mean))
        n = 0
        while True:
            n += 1
            line = (
                f"2026-01-01T00:00:00.000000Z  INFO cuzk_server::pipeline: proof completed "
                f"job_id=fleet-{self.index}-{n} total_ms=612345 partitions=10\n"
            )
            self._daemon_out.feed_data(line.encode())
            await asyncio.sleep(self._rng.uniform(0.5 * mean, 1.5 * mean))


class _Gone(Exception):
    """The manager said this instance is gone (``signals.gone``) during a phase."""


def ssl_context() -> ssl.SSLContext:
    """One context for every machine (an http:// manager never uses it; building one per
    client would cost 2,000 loads of the CA store)."""
    return ssl.create_default_context()
