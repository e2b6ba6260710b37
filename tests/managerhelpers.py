"""Helpers for tests that run the simulated manager (``cuzk_supervisor.sim.manager``) as a real
subprocess on loopback. Import them from any test (``tests/`` is on sys.path)::

    from managerhelpers import ManagerProcess, ManagerFactory, poll_until

    with ManagerFactory(tmp_path) as start:
        mgr = start("--param-timeout", "0.5", "--check-interval", "0.05")
        reg = mgr.post("/register", json={"label": "C.1", "min_rate": 0}).json()
        poll_until(lambda: mgr.instance(reg["uuid"])["state"] == "killed", 5)

The port is chosen by the sim itself (``--listen 127.0.0.1:0``) and read from its ready line,
so there is no race for a free port. Nothing here sleeps to synchronise: waiting is a poll with
a deadline or a wait for a line of output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pacehelpers import patient
from simhelpers import poll_until

T = TypeVar("T")
READY_RE = re.compile(r"sim-manager (?:listening|refusing connections) on (http://\S+)")
LISTENING_RE = re.compile(r"sim-manager listening on (http://\S+)")
ENV_PREFIX = "CUZK_SIM_MANAGER_"


class ManagerProcess:
    """One running ``python -m cuzk_supervisor.sim.manager``; stdout and stderr collected by
    reader threads. ``url`` is known once the first line is out (``start`` waits for it)."""

    def __init__(self, proc: subprocess.Popen[bytes], db: Path, args: list[str]) -> None:
        self.proc = proc
        self.db = db
        self.args = args
        self.url = ""
        self._lines: list[str] = []
        self._stderr: list[str] = []
        self._cond = threading.Condition()
        self._client: httpx.Client | None = None
        self._threads = [
            threading.Thread(target=self._read, args=(proc.stdout, self._lines), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self._stderr), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def start(
        cls,
        db: Path,
        *args: str,
        listen: str = "127.0.0.1:0",
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        timeout: float = 15.0,
    ) -> ManagerProcess:
        """Start it on ``listen``; wait for its first line (the URL). With ``ready`` also wait
        until it listens and answers ``GET /sim/faults``. Killed if any of that fails."""
        cmd = [sys.executable, "-m", "cuzk_supervisor.sim.manager", "--db", str(db)]
        cmd += ["--listen", listen, *args]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        child_env.update(env or {})
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)
        mgr = cls(proc, db, list(args))
        try:
            mgr.url = READY_RE.search(mgr.wait_for_line(READY_RE.pattern, timeout)).group(1)  # type: ignore[union-attr]
            if ready:
                mgr.wait_ready(timeout)
        except BaseException:
            mgr.kill()
            raise
        return mgr

    # --- output ---------------------------------------------------------------------------
    def _read(self, stream: Any, sink: list[str]) -> None:
        for raw in stream:
            with self._cond:
                sink.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    @property
    def stderr(self) -> str:
        with self._cond:
            return "\n".join(self._stderr)

    def wait_for_line(self, pattern: str, timeout: float = 10.0, after: int = 0) -> str:
        """The first stdout line at index >= ``after`` that ``pattern`` (a regex) matches."""
        regex = re.compile(pattern)
        timeout = patient(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self._lines[after:]:
                    if regex.search(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._alive_readers()):
                    raise AssertionError(
                        f"no line matching {pattern!r} within {timeout}s; "
                        f"rc={self.proc.poll()} stdout={self._lines!r} stderr={self._stderr!r}"
                    )
                self._cond.wait(min(remaining, 0.1))

    def _alive_readers(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until it listens and answers (after any --refuse-for window)."""
        self.wait_for_line(LISTENING_RE.pattern, timeout)
        poll_until(
            lambda: httpx.get(self.url + "/sim/faults", timeout=2).status_code == 200,
            timeout,
            what=f"{self.url} to answer",
        )

    # --- HTTP -----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def listen(self) -> str:
        return self.url.removeprefix("http://")

    def client(self, **kwargs: Any) -> httpx.Client:
        """A new client on this manager (the caller closes it)."""
        kwargs.setdefault("timeout", 10.0)
        return httpx.Client(base_url=self.url, **kwargs)

    @property
    def http(self) -> httpx.Client:
        """A shared client, closed with the process."""
        if self._client is None:
            self._client = self.client()
        return self._client

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, **kwargs)

    def register(self, label: str, min_rate: float = 0.0) -> dict[str, Any]:
        response = self.post("/register", json={"label": label, "min_rate": min_rate})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def status(self) -> list[dict[str, Any]]:
        response = self.get("/status")
        assert response.status_code == 200, response.text
        return list(response.json())

    def state(self) -> dict[str, Any]:
        """``GET /sim/state`` (never faulted): instances, bad hosts, kills, counter, faults."""
        response = self.get("/sim/state")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def instances(self) -> list[dict[str, Any]]:
        """The instances as ``/status`` lists them, read through ``/sim/state``, which no fault
        switch touches."""
        return list(self.state()["instances"])

    def instance(self, uuid: str) -> dict[str, Any] | None:
        """The ``/status`` entry of ``uuid`` (via ``/sim/state``), None if not listed."""
        return next((inst for inst in self.instances() if inst["uuid"] == uuid), None)

    def requests(
        self, since: int = 0, path: str | None = None, include_sim: bool = False
    ) -> list[dict[str, Any]]:
        """``GET /sim/requests``: what arrived, in arrival order."""
        params: dict[str, Any] = {"since": since}
        if path is not None:
            params["path"] = path
        if include_sim:
            params["sim"] = 1
        response = self.get("/sim/requests", params=params)
        assert response.status_code == 200, response.text
        return list(response.json())

    def faults(self, **changes: Any) -> dict[str, Any]:
        """``POST /sim/faults`` with ``changes`` (or GET if none); the settings now."""
        if not changes:
            return dict(self.get("/sim/faults").json())
        with self.client() as client:  # refuse_for drops the connection it came on
            response = client.post("/sim/faults", json=changes)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def kill_instance(self, uuid: str, reason: str = "manual kill") -> dict[str, Any]:
        """Kill with any ``reason`` through the sim's ``/sim/kill``."""
        response = self.post("/sim/kill", json={"uuid": uuid, "reason": reason})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def api_kill(self, uuid: str = "", vast_id: int = 0) -> httpx.Response:
        """The dashboard's kill, as an operator clicks it: ``POST /api/kill``."""
        body: dict[str, Any] = {}
        if uuid:
            body["uuid"] = uuid
        if vast_id:
            body["vast_id"] = vast_id
        return self.post("/api/kill", json=body)

    def sweep(self) -> dict[str, Any]:
        """``POST /sim/sweep``: one sweep of the monitor now; its kills and the sweep count."""
        response = self.post("/sim/sweep")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def manager_log(self) -> list[str]:
        """The texts of the manager's own log (``GET /sim/manager-log``), oldest first."""
        response = self.get("/sim/manager-log")
        assert response.status_code == 200, response.text
        return [line["text"] for line in response.json()]

    def logs(self, uuid: str, **params: Any) -> list[dict[str, Any]]:
        """``GET /api/instance-logs/{uuid}`` (the real endpoint, so faults apply)."""
        response = self.get(f"/api/instance-logs/{uuid}", params=params)
        assert response.status_code == 200, response.text
        return list(response.json())

    # --- lifetime -------------------------------------------------------------------------
    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` and wait; SIGKILL if it does not exit in ``timeout``. Exit code."""
        self._close_client()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"sim manager ignored signal {sig} for {timeout}s") from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        self._close_client()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def restart(self, *args: str, **kwargs: Any) -> ManagerProcess:
        """Stop this one (SIGTERM) and start another on the same port and database, with the
        same arguments unless ``args`` are given."""
        self.stop()
        kwargs.setdefault("listen", self.listen)
        return ManagerProcess.start(self.db, *(args or self.args), **kwargs)

    def __enter__(self) -> ManagerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


class ManagerFactory:
    """``factory(*args, db=..., env=..., ready=...)`` starts a manager (default database
    ``directory/manager.db``); every one started is killed on exit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[ManagerProcess] = []

    def __call__(
        self,
        *args: str,
        db: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        listen: str = "127.0.0.1:0",
    ) -> ManagerProcess:
        mgr = ManagerProcess.start(
            db or self.directory / "manager.db", *args, env=env, ready=ready, listen=listen
        )
        self.started.append(mgr)
        return mgr

    def restart(self, mgr: ManagerProcess, *args: str, **kwargs: Any) -> ManagerProcess:
        new = mgr.restart(*args, **kwargs)
        self.started.append(new)
        return new

    def __enter__(self) -> ManagerFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for mgr in self.started:
            mgr.kill()


def run_manager(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 15.0
) -> subprocess.CompletedProcess[str]:
    """Run the sim manager to completion (for start-up failures): its exit code and output."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    child_env.update(env or {})
    cmd = [sys.executable, "-m", "cuzk_supervisor.sim.manager", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=timeout)
