"""Helpers for tests that run the simulated cuzk daemon (``cuzk_supervisor.sim.daemon``) as a real
subprocess on loopback. Plain functions and one class; import them from any test::

    from simhelpers import SimProcess, free_tcp_port, poll_until, write_config

    sim = SimProcess.start(config=write_config(tmp_path, synthesis={"partition_workers": 2}),
                           listen=f"127.0.0.1:{free_tcp_port()}")
    try:
        stub = sim.stub()
        ...
    finally:
        sim.kill()

Nothing here sleeps to synchronise: waiting is always a poll with a deadline (``poll_until``)
or a wait for a log line (``SimProcess.wait_for_line``). The ``sim`` fixture in
``tests/sim/conftest.py`` starts processes that are killed at teardown.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import grpc
from pacehelpers import patient, scaled

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.proto import proving_pb2_grpc as pb_grpc

T = TypeVar("T")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
MAX_MESSAGE = 128 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
# Environment the sim reads; cleared for each test process so the host's settings never leak.
SIM_ENV_PREFIXES = ("CUZK_SIM_", "RUST_LOG", "NO_COLOR")


# The `sim` command at a quicker pace than the demo's, for tests that check what a run does, not
# how it looks at a person's pace: four bench proofs at time scale 400 (about 5 s, not 13; slower
# on a slow machine: pacehelpers), with an eighth of the real memory (as
# lifecyclehelpers.lifecycle_env).
def quick_sim() -> tuple[str, ...]:
    return ("--time-scale", f"{scaled(400):g}", "--bench-count", "4", "--memory-scale", "0.125")


def demo_sim() -> tuple[str, ...]:
    """The `sim` command at the demo's own pace (time scale 100), slower on a slow machine."""
    return ("--time-scale", f"{scaled(100):g}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed to a process that binds them later come from below the kernel's ephemeral range,
# in one slice per xdist worker. A port from ``bind(0)`` is only free "right now": until the
# process under test binds it (seconds later, after register and params), any other bind(0) on
# the host (the manager fixture, health tests, the other worker) can take it, and the test fails
# far from the cause. No bind(0) or outgoing connection ever lands below the ephemeral range, and
# the other worker draws from its own slice.
_POOL_LOW = 10000
_POOL_HIGH = _ephemeral_low()


def _worker_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    index = int(worker) % count if worker.isdigit() else 0
    size = (_POOL_HIGH - _POOL_LOW) // count
    start = _POOL_LOW + index * size
    return range(start, start + size)


_SLICE = _worker_slice()
# A random start, so two test sessions side by side (or a rerun soon after) rarely meet.
_cursor = itertools.count(random.randrange(len(_SLICE)) if len(_SLICE) > 0 else 0)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port for a process that will bind it later: free now, never handed out twice in this
    worker (until the slice wraps) and outside every pool the kernel picks from by itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if len(_SLICE) == 0:  # an ephemeral range reaching down to _POOL_LOW: let the kernel pick
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])
    for _ in range(len(_SLICE)):
        port = _SLICE[next(_cursor) % len(_SLICE)]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue  # in use (or in TIME_WAIT): the next one
            return port
    raise RuntimeError(f"no free TCP port in {_SLICE} on {host}")


def poll_until(
    check: Callable[[], T | Literal[False] | None],
    timeout: float,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Call ``check`` until it returns something truthy (returned); AssertionError after
    ``timeout`` seconds (stretched on a slow machine: pacehelpers.patient). Exceptions from
    ``check`` count as "not yet"; the last one is shown. The result is never ``None`` or
    ``False``: ``lambda: cond and value`` types as ``value``."""
    timeout = patient(timeout)
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


async def apoll_until(
    check: Callable[[], Awaitable[T | Literal[False] | None]],
    within: float,
    interval: float = 0.02,
    what: str = "it",
) -> T:
    """``poll_until`` for a coroutine function (deadline ``within`` seconds, stretched on a slow
    machine), without blocking the event loop."""
    within = patient(within)
    deadline = time.monotonic() + within
    last: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r} as TOML")


def write_config(
    directory: Path, name: str = "cuzk.toml", /, **sections: Mapping[str, Any]
) -> Path:
    """Write a cuzk TOML config: ``write_config(tmp, synthesis={"partition_workers": 2})``."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(val)}" for key, val in values.items())
        lines.append("")
    path = directory / name
    path.write_text("\n".join(lines))
    return path


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


class SimProcess:
    """One running ``python -m cuzk_supervisor.sim.daemon``, its stdout collected line by line
    (ANSI stripped) by a reader thread, or written to ``stdout_path`` if one is given."""

    def __init__(
        self, proc: subprocess.Popen[bytes], listen: str, stdout_path: Path | None
    ) -> None:
        self.proc = proc
        self.listen = listen
        self.stdout_path = stdout_path
        self.raw_lines: list[str] = []  # with ANSI escapes, exactly as printed
        self._lines: list[str] = []  # the same, stripped
        self._cond = threading.Condition()
        self._channel: grpc.Channel | None = None
        self._reader: threading.Thread | None = None
        if proc.stdout is not None:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        # stderr is drained too, so a chatty process can never block on a full pipe.
        self._stderr = bytearray()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    @classmethod
    def start(
        cls,
        *,
        listen: str,
        config: Path | None = None,
        args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        time_scale: float | None = None,
        stdout_path: Path | None = None,
        ready: bool = True,
        ready_timeout: float = 20.0,
    ) -> SimProcess:
        """Start the sim; with ``ready`` wait until GetStatus answers (killing it on failure)."""
        cmd = [sys.executable, "-m", "cuzk_supervisor.sim.daemon", "--listen", listen]
        if config is not None:
            cmd += ["--config", str(config)]
        if time_scale is not None:
            cmd += ["--time-scale", f"{time_scale:g}"]
        cmd += list(args)
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(SIM_ENV_PREFIXES)}
        child_env.update(env or {})
        out = stdout_path.open("wb") if stdout_path is not None else subprocess.PIPE
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=child_env)
        finally:
            if stdout_path is not None:
                out.close()  # type: ignore[union-attr]
        sim = cls(proc, listen, stdout_path)
        if ready:
            try:
                sim.wait_ready(ready_timeout)
            except BaseException:
                sim.kill()
                raise
        return sim

    # --- output ----------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with self._cond:
                self.raw_lines.append(line)
                self._lines.append(strip_ansi(line))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def lines(self) -> list[str]:
        """Everything printed so far, ANSI stripped."""
        if self.stdout_path is not None:
            return strip_ansi(self.stdout_path.read_text(errors="replace")).splitlines()
        with self._cond:
            return list(self._lines)

    def wait_for_line(self, pattern: str, timeout: float = 10.0, after: int = 0) -> str:
        """The first stripped line (at index >= ``after``) that ``pattern`` (a regex) matches."""
        regex = re.compile(pattern)

        def find() -> str | None:
            lines = self.lines if self.stdout_path is not None else self._lines
            return next((ln for ln in lines[after:] if regex.search(ln)), None)

        if self.stdout_path is not None:
            return poll_until(find, timeout, what=f"a line matching {pattern!r}")
        deadline = time.monotonic() + patient(timeout)
        with self._cond:
            while (found := find()) is None:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader_alive()):
                    tail = "\n".join(self.lines[-15:])
                    raise AssertionError(f"no line matching {pattern!r}; output tail:\n{tail}")
                self._cond.wait(min(left, 0.1))
            return found

    def _reader_alive(self) -> bool:
        return self._reader is not None and self._reader.is_alive()

    def _read_stderr(self) -> None:
        assert isinstance(self.proc.stderr, io.BufferedReader)  # Popen's default buffering
        while chunk := self.proc.stderr.read1(65536):
            self._stderr += chunk

    def stderr_text(self, timeout: float = 5.0) -> str:
        """Everything written to stderr; once the process has exited, all of it."""
        if self.proc.poll() is not None:
            self._stderr_reader.join(timeout)
        return self._stderr.decode(errors="replace")

    # --- gRPC -------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.listen

    def channel(self) -> grpc.Channel:
        """A shared channel with the real server's 128 MiB limits."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.listen, options=CHANNEL_OPTIONS)
        return self._channel

    def stub(self) -> pb_grpc.ProvingEngineStub:
        return pb_grpc.ProvingEngineStub(self.channel())

    def status(self, timeout: float = 2.0) -> pb.GetStatusResponse:
        return self.stub().GetStatus(pb.GetStatusRequest(), timeout=timeout)

    def metrics(self, timeout: float = 2.0) -> str:
        return self.stub().GetMetrics(pb.GetMetricsRequest(), timeout=timeout).prometheus_text

    def wait_ready(self, timeout: float = 20.0) -> pb.GetStatusResponse:
        """Ready = an answered GetStatus (the real daemon's only readiness probe)."""

        def answered() -> pb.GetStatusResponse | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim exited with {self.proc.returncode}")
            with grpc.insecure_channel(self.listen) as probe:
                stub = pb_grpc.ProvingEngineStub(probe)
                return stub.GetStatus(pb.GetStatusRequest(), timeout=0.5)

        return poll_until(answered, timeout, interval=0.05, what=f"sim ready on {self.listen}")

    # --- lifecycle --------------------------------------------------------------------------
    def send(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(patient(timeout))

    def kill(self) -> None:
        """SIGKILL and reap (idempotent); closes the channel."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        # A leaked grandchild may still hold stdout open: then leave the pipe to the (daemon)
        # reader thread rather than close it under its feet.
        if self._reader is not None:
            self._reader.join(2)
        if self.proc.stdout is not None and not self._reader_alive():
            self.proc.stdout.close()
        self._stderr_reader.join(2)
        if self.proc.stderr is not None and not self._stderr_reader.is_alive():
            self.proc.stderr.close()


def submit_request(
    request_id: str = "", kind: int = pb.POREP_SEAL_COMMIT, payload: bytes | None = None
) -> pb.SubmitProofRequest:
    """A SubmitProofRequest; PoRep gets a small valid C1 envelope unless ``payload`` is given."""
    if payload is None:
        from cuzk_supervisor.sim.daemon.c1 import make_c1

        payload = make_c1(2_000) if kind == pb.POREP_SEAL_COMMIT else b""
    # ``kind`` is any number: tests send unknown ones (99) on purpose.
    proof_kind = cast("pb.ProofKind", kind)
    return pb.SubmitProofRequest(
        request_id=request_id, proof_kind=proof_kind, vanilla_proof=payload
    )
