"""The cuzk daemon as a child we fully own: config, spawn, readiness, output, stop, exit.

One ``DaemonProcess`` is one run of the daemon. It never decides what happens after an exit: it
gathers the facts and ``exits.classify_exit`` names them; restarts are ``daemon.keeper``'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from cuzk_supervisor import killtree
from cuzk_supervisor.adapters import files
from cuzk_supervisor.adapters.machine.cgroupmem import read_oom_kill_count
from cuzk_supervisor.adapters.machine.proctree import ProcessTree
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.core.exits import DaemonExit, ExitFacts, ExitKind, classify_exit
from cuzk_supervisor.daemon import config as daemon_config
from cuzk_supervisor.daemon import leftovers, pidfile
from cuzk_supervisor.daemon.childenv import child_environ
from cuzk_supervisor.daemon.config import DaemonConfigValues
from cuzk_supervisor.daemon.output import LineSink, OutputPump, RotatingLineFile
from cuzk_supervisor.daemon.peakrss import RSS_INTERVAL_S, PeakRss
from cuzk_supervisor.daemon.preflight import address_in_use, resolve_binary
from cuzk_supervisor.daemon.spec import (
    AliveProbe,
    DaemonSettings,
    DaemonStartFailed,
    ReadyProbe,
    RssSampler,
    Spawner,
    grpc_alive_probe,
    grpc_ready_probe,
    tree_rss_sampler,
)
from cuzk_supervisor.deadline import within

log = structlog.get_logger()

OUTPUT_DRAIN_S = 1.0  # after the daemon exits, how long its output may take to reach EOF
ADDRESS_RELEASE_S = 1.0  # how long an address stays taken before the start is "address in use"


class DaemonProcess:
    """One run of the daemon, from config file to classified exit."""

    def __init__(
        self,
        settings: DaemonSettings,
        values: DaemonConfigValues,
        *,
        ready_probe: ReadyProbe = grpc_ready_probe,
        alive_probe: AliveProbe = grpc_alive_probe,
        memory_at_limit: Callable[[], bool] = lambda: False,
        spawn: Spawner = asyncio.create_subprocess_exec,
        line_sinks: Sequence[LineSink] = (),
        rss_sampler: RssSampler | None = None,
        rss_interval_s: float = RSS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.spec = settings
        self.values = values
        self.address = parse_address(values.listen)
        self._ready_probe = ready_probe
        self._alive_probe = alive_probe
        self._liveness: asyncio.Task[None] | None = None
        self._unresponsive = ""
        self._memory_at_limit = memory_at_limit
        self._spawn = spawn
        self._line_sinks = tuple(line_sinks)
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: OutputPump | None = None
        self._pump_tasks: list[asyncio.Task[None]] = []
        self._log_file: RotatingLineFile | None = None
        self._ready = False
        self._stop_requested = False
        self._started_at = 0.0
        self._oom_before: int | None = None
        self._exit: DaemonExit | None = None
        self._stopped: DaemonExit | None = None
        self._exit_lock = asyncio.Lock()
        # The stat files the tree's reader keeps open are closed at the exit (``wait``), not
        # when a garbage collection finds this run: one descriptor per restart until then.
        self._close_tree: Callable[[], None] = lambda: None
        if rss_sampler is None:
            tree = ProcessTree()
            rss_sampler, self._close_tree = tree_rss_sampler(tree), tree.close
        self._clock = clock  # the liveness probe's cadence and what spares it
        self._sleep = sleep
        self._peak = PeakRss(rss_sampler, rss_interval_s, clock=clock, sleep=sleep)
        self._rss_task: asyncio.Task[None] | None = None
        self._answered_at = -float("inf")  # when an answer seen elsewhere last came (monotonic)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def ready(self) -> bool:
        return self._ready and self._exit is None

    @property
    def output(self) -> OutputPump | None:
        return self._pump

    @property
    def peak_rss_bytes(self) -> int:
        """The highest RSS of the daemon's process tree seen while it ran."""
        return self._peak.bytes

    def note_rss(self, rss_bytes: int | None) -> None:
        """A reading of the tree's RSS taken elsewhere (``PeakRss.note``)."""
        self._peak.note(rss_bytes)

    def note_answer(self) -> None:
        """The daemon answered a call made elsewhere (the health watch's GetMetrics): the next
        liveness probe within ``liveness_interval_s`` is spared (a new channel and connection:
        most of the idle supervisor's CPU a minute)."""
        self._answered_at = self._clock()

    def _oom_count(self) -> int | None:
        if self.spec.cgroup_dir is None:
            return None
        return read_oom_kill_count(self.spec.cgroup_dir)

    def _command(self, binary: str) -> list[str]:
        return [
            binary, *self.spec.extra_args, "--config", str(self.spec.config_path),
            "--listen", str(self.address), "--log-level", self.values.log_level,
        ]  # fmt: skip

    def _fail(self, reason: str) -> DaemonStartFailed:
        self._exit = DaemonExit(ExitKind.FAILED_TO_START, reason, permanent=True)
        return DaemonStartFailed(self._exit)

    async def start(self) -> None:
        """Spawn and return once the daemon answers GetStatus; raise DaemonStartFailed if not."""
        spec = self.spec
        base = daemon_config.load_base(spec.base_config)
        try:
            daemon_config.write_verified(spec.config_path, self.values, base)
        except files.WriteError as exc:
            raise self._fail(str(exc)) from None
        await asyncio.to_thread(pidfile.reclaim_stale_daemon, spec)
        binary, problem = resolve_binary(spec.binary)
        if binary is None:
            raise self._fail(problem)
        if await self._address_stays_busy():
            raise self._fail(f"address in use: {self.address}")
        if self.address.path is not None:
            try:
                files.make_folder(self.address.path.parent)
            except OSError as exc:
                where, why = self.address.path.parent, files.describe(exc)
                raise self._fail(f"cannot make socket folder {where}: {why}") from None
        if spec.log_path is not None:
            try:
                log_file = RotatingLineFile(spec.log_path, spec.log_max_bytes, spec.log_backups)
                self._log_file = log_file
            except files.WriteError as exc:
                raise self._fail(str(exc)) from None
        self._pump = OutputPump("cuzk", self._log_file, spec.log_events_per_second)
        for sink in self._line_sinks:
            self._pump.add_sink(sink)
        env = child_environ({**spec.env, "NO_COLOR": "1"})
        self._oom_before = self._oom_count()
        command = self._command(binary)
        try:
            # umask: its socket and files never world-writable; its own session and process
            # group: we signal the group.
            self._proc = await self._spawn(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, umask=files.CHILD_UMASK,
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise self._fail(f"cannot execute {binary}: {exc.strerror or exc}") from None
        self._started_at = time.monotonic()
        self._rss_task = asyncio.create_task(self._peak.watch(self._proc.pid))
        pidfile.write_pidfile(spec, self._proc.pid)
        assert self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._pump_tasks = [
            asyncio.create_task(self._pump.pump(self._proc.stdout, "stdout")),
            asyncio.create_task(self._pump.pump(self._proc.stderr, "stderr")),
        ]
        log.info("daemon.spawned", pid=self._proc.pid, command=command,
                 config=str(spec.config_path))  # fmt: skip
        await self._await_ready()

    async def _address_stays_busy(self) -> bool:
        """In use now and a moment later: a stale daemon we just stopped can hold its socket for a
        few milliseconds while the kernel tears it down."""
        deadline = time.monotonic() + ADDRESS_RELEASE_S
        while address_in_use(self.address):
            if time.monotonic() >= deadline:
                return True
            await asyncio.sleep(0.05)
        return False

    async def _await_ready(self) -> None:
        assert self._proc is not None
        probe = asyncio.create_task(self._ready_probe(self.address, self.spec.startup_deadline_s))
        exited = asyncio.create_task(self._proc.wait())
        done, _ = await asyncio.wait({probe, exited}, return_when=asyncio.FIRST_COMPLETED)
        if probe in done and probe.exception() is None:
            exited.cancel()
            self._ready = True
            log.info("daemon.ready", pid=self._proc.pid, address=str(self.address),
                     startup_s=round(time.monotonic() - self._started_at, 3))  # fmt: skip
            self._liveness = asyncio.create_task(self._watch_liveness())
            return
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await probe
        if exited in done:
            result = await self.wait()
        else:
            exited.cancel()
            error = probe.exception()
            reason = f"never ready within {self.spec.startup_deadline_s:g} s ({error})"
            await self.stop()
            result = DaemonExit(ExitKind.FAILED_TO_START, reason, permanent=True)
            self._exit = result
        raise DaemonStartFailed(result)

    async def _watch_liveness(self) -> None:
        """A daemon that accepts calls but never answers is as good as dead: after N missed
        GetStatus probes in a row, kill it so the keeper restarts it. A probe is spared when an
        answer to another call came within the interval (``note_answer``)."""
        spec = self.spec
        misses = 0
        while True:
            await self._sleep(spec.liveness_interval_s)
            if self._clock() - self._answered_at < spec.liveness_interval_s:
                misses = 0  # it answered a call of the health watch's meanwhile
                continue
            try:
                await within(
                    self._alive_probe(self.address, spec.liveness_timeout_s),
                    spec.liveness_timeout_s + 1.0,
                )
                misses = 0
            except Exception as exc:  # any failure to answer counts as a miss
                misses += 1
                log.warning("daemon.liveness_missed", misses=misses, of=spec.liveness_failures,
                            reason=str(exc)[:200])  # fmt: skip
                if misses >= spec.liveness_failures:
                    assert self._proc is not None
                    self._unresponsive = (
                        f"unresponsive: {misses} GetStatus probes unanswered "
                        f"({spec.liveness_timeout_s:g} s each); killed"
                    )
                    log.error("daemon.unresponsive", pid=self._proc.pid, reason=self._unresponsive)
                    self._signal_group(signal.SIGKILL)
                    return

    async def wait(self) -> DaemonExit:
        """Wait for the daemon to exit (and its output to drain); classify it once."""
        if self._exit is not None:
            return self._exit
        assert self._proc is not None
        returncode = await self._proc.wait()
        if self._liveness is not None:
            self._liveness.cancel()
        if self._rss_task is not None:
            self._rss_task.cancel()
        self._close_tree()
        async with self._exit_lock:
            if self._exit is not None:
                return self._exit
            await self._drain_output()
            if self._log_file is not None:
                self._log_file.close()
            facts = ExitFacts(
                returncode=returncode,
                was_ready=self._ready,
                stop_requested=self._stop_requested,
                oom_kills_before=self._oom_before,
                oom_kills_after=self._oom_count(),
                memory_at_limit=self._memory_at_limit(),
                last_lines=tuple(self._pump.tail) if self._pump else (),
                uptime_s=time.monotonic() - self._started_at,
                peak_rss_bytes=self.peak_rss_bytes,
                unresponsive=self._unresponsive,
            )
            self._exit = classify_exit(facts)
            self._ready = False
            level = "info" if self._exit.kind is ExitKind.CLEAN else "warning"
            getattr(log, level)("daemon.exited", pid=self._proc.pid, **self._exit.as_fields())
            return self._exit

    async def _drain_output(self) -> None:
        """Read what the daemon wrote before it exited. A leaked descendant (in another session)
        can hold the pipes open for ever, so EOF is awaited only briefly, then our ends close."""
        if not self._pump_tasks:
            return
        _, pending = await asyncio.wait(self._pump_tasks, timeout=OUTPUT_DRAIN_S)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("daemon.output_held_open", detail="a descendant still holds its pipes")
        for result in await asyncio.gather(*self._pump_tasks, return_exceptions=True):
            if isinstance(result, Exception):  # a bug of ours: lines went neither out nor counted
                log.error("daemon.output_pump_failed", reason=f"{type(result).__name__}: {result}")

    def _signal_group(self, signum: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signum)

    def _has_exited(self) -> bool:
        """Peek (without reaping: its waiter collects it) whether the daemon has exited."""
        assert self._proc is not None
        if self._proc.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # already collected by its waiter
        return info is not None

    async def stop(self) -> DaemonExit:
        """SIGTERM to the group, SIGKILL after the grace period, wait for every member; a second
        stop (the keeper's last one) returns the same exit at once."""
        if self._proc is None:
            return self._exit or DaemonExit(ExitKind.FAILED_TO_START, "never started")
        if self._stopped is not None:
            return self._stopped
        pgid = self._proc.pid
        if not self._has_exited():
            # Only a stop that found it running explains its exit; one that comes after the
            # daemon died (e.g. OOM-killed a moment ago) must not hide why it died.
            self._stop_requested = True
            self._peak.read(pgid)  # its size as we stop it counts too
            self._signal_group(signal.SIGTERM)
            try:
                await within(asyncio.shield(self._proc.wait()), self.spec.stop_grace_s)
            except TimeoutError:
                log.warning("daemon.stop_grace_expired", pid=pgid, grace_s=self.spec.stop_grace_s)
                self._signal_group(signal.SIGKILL)
        result = await self.wait()
        await self._reap_group(pgid)
        leftovers.forget(pidfile.pidfile_path(self.spec))
        self._stopped = result
        return result

    async def _reap_group(self, pgid: int) -> None:
        """Kill what is left of the group (children the daemon left behind) and wait for it."""
        report = await asyncio.to_thread(killtree.kill_tree, [pgid], 0.0, 1.0)
        if report.terminated or report.killed:
            pids = [*report.terminated, *report.killed]
            log.warning("daemon.group_leftovers", pgid=pgid, pids=pids)
        if report.survivors:
            log.error("daemon.group_survivors", pgid=pgid, pids=report.survivors)
