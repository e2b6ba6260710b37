"""The machinery of ``bench/fleet.py``: virtual machines running the product's own manager-facing
code in one process on virtual time, and a record of every request they make.

A :class:`VirtualMachine` is built from the supervisor's own pieces, its edges by the builder the
composition root uses (``cuzk_supervisor.composeedges``): the :class:`ManagerClient` over its own
persistent HTTP/1.1 connection (:class:`HttpTransport`, TLS through the bench's proxy), the durable
:class:`Outbox` on a :class:`StateKeeper`, the :class:`LogShipper` fed by the structlog events of
this machine (the product's ``shipping_processor``) and by its children's output through the
product's :class:`OutputPump` (the fetch's under ``setup``, the daemon's under ``benchdaemon`` then
``cuzk``), the :class:`Reporter` (register, the reports, the outbox task, the kill look-ups, the
``/running`` ping) and the :class:`Monitors` loops (the status line and what it asks of the
manager). Only what never talks to the manager is a stand-in: the children (lines at a set pace),
the memory watch and the GPUs (nothing to say), the proofs (a phase is a wait) and the state file
(kept in memory: the keeper is the product's, the disk is not).

Every component takes the one clock of :mod:`cuzk_supervisor.sim.vtime` by injection; the
loop's clock jumps to its next timer unless a request is in flight (:data:`IN_FLIGHT`), so a
manager's slowness is real time and shows.

The one thing added on the way: each machine's transport is wrapped (:class:`CountingTransport`)
to record every request (virtual start and end, the machine's phase, path, status, HTTP bytes
both ways, the connection it went on) and to note a request made before an earlier answer's
``Retry-After`` had passed.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import random
import ssl
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from cuzk_supervisor.adapters.logship.lines import shipping_processor
from cuzk_supervisor.adapters.machine.gpu import StaticProbe
from cuzk_supervisor.adapters.manager.http import HttpTransport
from cuzk_supervisor.adapters.manager.wire import HttpAnswer, HttpRequest, Timeouts
from cuzk_supervisor.adapters.state.doc import Report, SupervisorState
from cuzk_supervisor.adapters.state.store import StateKeeper, StateStore
from cuzk_supervisor.composeedges import build_edges, build_reporter
from cuzk_supervisor.core.backoff import parse_retry_after
from cuzk_supervisor.core.reports import OUTCOME_OK
from cuzk_supervisor.core.risk import RiskLevel
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.lifecycle.monitors import Monitors
from cuzk_supervisor.lifecycle.retries import LifecycleRetries
from cuzk_supervisor.lifecycle.shared import Progress, Signals
from cuzk_supervisor.lifecycle.values import MonitorSettings
from cuzk_supervisor.serve.metricsink import NoMetrics
from cuzk_supervisor.settings import Settings
from cuzk_supervisor.settings.policies import policy
from cuzk_supervisor.sim.vtime import VirtualClock

MIDDLE_PHASES = ("plan", "warmup", "restart", "settle", "bench")
MIDDLE_SHARES = (0.02, 0.3, 0.05, 0.13, 0.5)
EARLY_TOLERANCE_S = 0.5  # a request this close to its Retry-After is not called early
IN_FLIGHT = [0]
"""Requests on the wire, all machines (and the bench's own) together: the loop's ``busy``."""


def busy() -> bool:
    return IN_FLIGHT[0] > 0


# --- the request record ---------------------------------------------------------------------------


@dataclass(slots=True)
class Request:
    """One request as a machine made it (virtual seconds)."""

    machine: int
    cohort: str
    phase: str
    start: float
    end: float
    path: str
    status: int  # 0: no answer (refused, timed out, dropped)
    bytes_out: int  # HTTP bytes the machine sent (request line, headers, body)
    bytes_in: int  # HTTP bytes it received (status line, headers, body)
    port: int | None = None  # the local port of the connection it went on
    connection: int = 0  # that connection's number among the machine's (1, 2 ...)
    raw: int | None = None  # bytes on the wire with TLS, handshakes included (the proxy's)
    early: bool = False  # made before an earlier answer's Retry-After had passed


@dataclass
class Recorder:
    """Every request of the fleet, in the order they ended."""

    requests: list[Request] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


class CountingTransport:
    """One machine's transport: the product's HttpTransport, each request recorded."""

    def __init__(self, inner: HttpTransport, machine: VirtualMachine) -> None:
        self.inner = inner
        self.machine = machine
        self.not_before = float("-inf")  # the latest Retry-After end of an answer received

    async def send(self, request: HttpRequest, timeouts: Timeouts) -> HttpAnswer:
        m, inner = self.machine, self.inner
        start = m.clock.monotonic()
        entry = Request(m.index, m.cohort, m.progress.phase, start, start,
                        request.target.split("?")[0], 0, 0, 0)  # fmt: skip
        entry.early = start < self.not_before - EARLY_TOLERANCE_S
        out0, in0 = inner.bytes_out, inner.bytes_in
        IN_FLIGHT[0] += 1
        try:
            answer = await inner.send(request, timeouts)
        except BaseException as exc:
            name = type(exc).__name__
            m.recorder.errors[name] = m.recorder.errors.get(name, 0) + 1
            raise
        else:
            entry.status = answer.status
            if answer.status in (429, 503):
                after = parse_retry_after(answer.header("retry-after"), m.clock.time())
                if after is not None:
                    self.not_before = max(self.not_before, m.clock.monotonic() + after)
            return answer
        finally:
            IN_FLIGHT[0] -= 1
            entry.end = m.clock.monotonic()
            entry.bytes_out, entry.bytes_in = inner.bytes_out - out0, inner.bytes_in - in0
            entry.port, entry.connection = inner.local_port(), inner.opened
            m.recorder.requests.append(entry)

    async def aclose(self) -> None:
        await self.inner.aclose()


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


class MemoryStateKeeper(StateKeeper):
    """The keeper, its order and its copies are the product's; the state stays in memory."""

    def __init__(self) -> None:
        super().__init__(StateStore("/nonexistent/fleet-bench-state.json"), SupervisorState())

    async def update(self, change: Any) -> SupervisorState:
        async with self._lock:
            self._state = change(self._state)
            return self._state


# --- one machine ---------------------------------------------------------------------------------


CURRENT: contextvars.ContextVar[VirtualMachine | None] = contextvars.ContextVar(
    "fleet_machine", default=None
)


def route_to_machine(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The bench's structlog processor: each event goes to the shipper of the machine whose task
    logged it (the product's ``shipping_processor``), then is dropped (no terminal)."""
    machine = CURRENT.get()
    if machine is None or event_dict.get("event") == "child.line":  # never shipped: cheap out
        raise structlog.DropEvent
    machine.log_events += 1
    event_dict.setdefault("phase", machine.progress.phase)
    event_dict["level"] = method_name
    event_dict["timestamp"] = f"{machine.clock.time():.3f}"
    machine.ship(logger, method_name, event_dict)
    machine.said.append(str(event_dict.get("event")))
    raise structlog.DropEvent


def configure_logging() -> None:
    """As ``observe.configure_logging`` at level info, with the shipping processor per machine."""
    structlog.configure(
        processors=[route_to_machine],  # first: a daemon's child.line event is dropped at once
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.ReturnLoggerFactory(),
        cache_logger_on_first_use=False,
    )


@dataclass(frozen=True)
class Lifecycle:
    """How long the phases that do not talk to the manager take (virtual seconds, each drawn in
    ``± spread`` of it), the rate reported, and the children's output in lines a second."""

    params_s: float = 480.0
    middle_s: float = 720.0  # plan, warmup, restart, settle and bench together
    spread: float = 0.2
    rate: float = 60.0
    min_rate: float = 30.0
    fetch_lines_per_s: float = 5.0
    daemon_lines_per_s: float = 5.0
    run_lines_per_s: float = 0.02


@dataclass
class Outcome:
    registered_at: float | None = None
    running_at: float | None = None
    verdict: bool | None = None  # the manager's pass/fail, None: none received
    gone: str | None = None
    error: str | None = None
    reports: list[Report] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, entered at)


class VirtualMachine:
    def __init__(
        self, index: int, cohort: str, settings: Settings, life: Lifecycle, recorder: Recorder,
        clock: VirtualClock, context: ssl.SSLContext, seed: int,
    ) -> None:  # fmt: skip
        self.index, self.cohort, self.life, self.recorder = index, cohort, life, recorder
        self.clock = clock
        self.label = f"C.{900_000_000 + index}"
        self.outcome = Outcome()
        self.log_events = 0
        self.said: list[str] = []
        self._rng = random.Random(seed)
        self.http = HttpTransport(settings.manager_url, ssl_context=context, clock=clock.monotonic)
        self.transport = CountingTransport(self.http, self)
        edges = build_edges(
            settings, self.label, life.min_rate, shipper_rng=random.Random(seed + 1),
            transport=self.transport, clock=clock.monotonic, wall_clock=clock.time,
            rng=random.Random(seed),
        )  # fmt: skip
        self.manager, self.shipper = edges.manager, edges.shipper
        self.ship = shipping_processor(self.shipper)
        self.keeper = MemoryStateKeeper()
        self.progress, self.signals = Progress(), Signals()
        metrics = NoMetrics()
        self.reporter = build_reporter(
            settings, edges, state=self.keeper, signals=self.signals, progress=self.progress,
            retries=LifecycleRetries(), metrics=metrics, clock=clock.monotonic,
            wall_clock=clock.time, rng=random.Random(seed + 2),
        )  # fmt: skip
        watch: Any = QuietWatch()
        daemon: Any = NoRestarts()
        self.monitors = Monitors(
            policy(MonitorSettings, settings), progress=self.progress, signals=self.signals,
            watch=watch, gpu=NoGpu(), metrics=metrics, daemon=daemon, manager=self.reporter,
            clock=clock.monotonic, rng=random.Random(seed + 3),
        )  # fmt: skip

    def _drawn(self, seconds: float) -> float:
        spread = self.life.spread
        return seconds * self._rng.uniform(1 - spread, 1 + spread)

    # -- the run, as Lifecycle.run: the shipper, the monitors and the outbox task beside it --

    async def run(self, stop: asyncio.Event) -> None:
        CURRENT.set(self)
        try:
            async with asyncio.TaskGroup() as group:
                shipper_task = group.create_task(self.shipper.run())
                loops = [group.create_task(loop()) for loop in self.monitors.loops()]
                loops.append(group.create_task(self.reporter.outbox_loop()))
                try:
                    await self._phases(stop)
                finally:
                    for task in loops:
                        task.cancel()
                    self.shipper.stop()
                    await asyncio.wait({shipper_task}, timeout=10)
        except Exception as exc:  # a bug or an unexpected answer: this machine's outcome
            self.outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.outcome.reports = [*self.reporter.outbox.pending, *self.reporter.outbox.acked]
            await self.manager.aclose()

    async def _enter(self, phase: str) -> None:
        await self.keeper.update(lambda st: dataclasses.replace(st, phase=phase))
        self.progress.phase = phase
        self.progress.phase_started = self.clock.monotonic()
        self.outcome.phases.append((phase, self.clock.monotonic()))
        structlog.get_logger().info("phase.entered", phase=phase)

    async def _phases(self, stop: asyncio.Event) -> None:
        life = self.life
        gone = asyncio.ensure_future(self.signals.gone.wait())
        try:
            await self.reporter.resend()
            await self._enter("register")
            await self.reporter.register()
            self.outcome.registered_at = self.clock.monotonic()
            await self._enter("params")
            await self._child("setup", life.fetch_lines_per_s, self._drawn(life.params_s), gone)
            await self.reporter.params_done()
            for phase, share in zip(MIDDLE_PHASES, MIDDLE_SHARES, strict=True):
                await self._enter(phase)
                seconds = self._drawn(life.middle_s) * share
                await self._child("benchdaemon", life.daemon_lines_per_s, seconds, gone)
            await self._enter("report")
            self.shipper.add_line("benchout", f"rate={life.rate:.2f} proofs/h (fleet bench)")
            done = await self.reporter.bench_done(life.rate)
            self.outcome.verdict = done.passed if done.outcome == OUTCOME_OK else None
            if self.outcome.verdict is False:
                return
            await self._enter("run")
            await self.reporter.running()
            self.outcome.running_at = self.clock.monotonic()
            stopped = asyncio.ensure_future(stop.wait())
            daemon = asyncio.ensure_future(self._child("cuzk", life.run_lines_per_s, None, gone))
            try:
                await asyncio.wait({stopped, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
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

    async def _child(
        self, source: str, per_s: float, seconds: float | None, gone: asyncio.Future[Any]
    ) -> None:
        """A child writing ``per_s`` lines a second (jittered, in chunks of up to a second)
        through the product's pump for ``seconds`` (None: until cancelled); a kill ends it."""
        pump = OutputPump(source, None)
        pump.add_listener(self.shipper.listener(source))
        reader = asyncio.StreamReader()
        pumping = asyncio.ensure_future(pump.pump(reader, "stdout"))
        end = None if seconds is None else self.clock.monotonic() + seconds
        step = 1.0 if per_s >= 1 else 1.0 / max(per_s, 1e-6)
        n = 0
        try:
            while end is None or self.clock.monotonic() < end:
                wait = step * self._rng.uniform(0.5, 1.5)
                if end is not None:
                    wait = min(wait, max(0.0, end - self.clock.monotonic()))
                done, _ = await asyncio.wait({gone}, timeout=wait)
                if done:
                    raise _Gone
                count = max(1, round(per_s * wait)) if per_s >= 1 else 1
                lines = []
                for _ in range(count):
                    n += 1
                    lines.append(f"{self.clock.time():.3f} INFO {source}: step {n} of the "
                                 f"fleet bench's stand-in, fields x=1 y=2 z=3\n")  # fmt: skip
                reader.feed_data("".join(lines).encode())
        finally:
            reader.feed_eof()
            await pumping


class _Gone(Exception):
    """The manager said this instance is gone (``signals.gone``) during a phase."""
