"""What the simulated manager's handlers share (``App``): its store, its fault switches, its
monitor, its logs (instances' and its own), the journal of requests and the counters, the
listener; and what a kill does beyond the record: recorded for ``/sim/state``, the container
destroyed (``--destroy-command``, ``--vastai``'s ``destroy instance``) in the background;
``POST /api/deploy``'s ``create instance``; ``GET /status``'s body, cached between writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuzk_supervisor.sim.manager.counters import Counters
from cuzk_supervisor.sim.manager.faults import Faults
from cuzk_supervisor.sim.manager.gojson import go_dumps
from cuzk_supervisor.sim.manager.instances import Instance, rfc3339
from cuzk_supervisor.sim.manager.listener import Listener
from cuzk_supervisor.sim.manager.platform import vast_id_from_label
from cuzk_supervisor.sim.manager.records import LogBook, ManagerLog, RequestJournal
from cuzk_supervisor.sim.manager.store import Store
from cuzk_supervisor.sim.manager.sweep import Monitor, Timeouts
from cuzk_supervisor.sim.manager.vast import CREATE_TIMEOUT, VastCLI, VastError


class App:
    """Everything the handlers share: state, logs, journal, faults, the monitor, the listener."""

    def __init__(
        self,
        store: Store,
        faults: Faults,
        timeouts: Timeouts,
        say: Callable[[str], None],
        destroy_command: str | None = None,
        verbose: bool = False,
        platform_file: Path | None = None,
        vast: VastCLI | None = None,
    ) -> None:
        self.store = store
        self.faults = faults
        self.say = say
        self.destroy_command = destroy_command
        self.verbose = verbose
        self.vast = vast
        self.create_timeout = CREATE_TIMEOUT
        self._deploys: list[dict[str, Any]] = []
        self.logs = LogBook()
        self.manager_log = ManagerLog()
        self.journal = RequestJournal()
        self.counters = Counters()
        self._status_cache: tuple[tuple[int, int], bytes] | None = None
        self.listener: Listener | None = None
        self._lock = threading.Lock()
        self._kills: list[dict[str, Any]] = []
        self.monitor = Monitor(store, timeouts, self.log, self.killed, platform_file, vast)

    def status_body(self) -> bytes:
        """``GET /status``'s body: the whole table, killed rows included, as the real one
        answers it every time; encoded again only after the database changed."""
        key = self.store.change_key()
        with self._lock:
            cached = self._status_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        body = (go_dumps([inst.to_json() for inst in self.store.instances()]) + "\n").encode()
        with self._lock:
            self._status_cache = (key, body)
        return body

    def log(self, message: str) -> None:
        """A line of the manager's own log (``log.Printf`` in the real one)."""
        self.manager_log.write(message, time.time())
        if self.verbose:
            sys.stderr.write(message + "\n")

    def killed(
        self, inst: Instance | None, cause: str, destroyed: bool, vast_id: int | None = None
    ) -> None:
        """An instance was killed (``inst``), its container destroyed (``destroyed``), or
        both. Recorded for ``/sim/state``; ``--destroy-command`` runs (in the background)
        for a destroyed one, with the instance in its environment."""
        if vast_id is None and inst is not None:
            vast_id = vast_id_from_label(inst.label)
        event = {
            "uuid": inst.uuid if inst else None,
            "label": inst.label if inst else None,
            "runner_id": inst.runner_id if inst else None,
            "reason": inst.kill_reason if inst else None,
            "cause": cause,
            "ts": rfc3339(inst.killed_at if inst and inst.killed_at else time.time()),
            "destroyed": destroyed,
            "vast_id": vast_id,
        }
        with self._lock:
            self._kills.append(event)
        if inst is not None:
            self.say(f"sim-manager killed {inst.uuid} ({inst.label}): {inst.kill_reason}")
        if destroyed:
            if vast_id is not None:
                self.log(f"[monitor] destroyed vast instance {vast_id}")
            if self.destroy_command:
                threading.Thread(target=self._destroy, args=(inst, vast_id), daemon=True).start()
            if self.vast is not None and vast_id is not None and vast_id > 0:
                threading.Thread(target=self._vast_destroy, args=(vast_id,), daemon=True).start()

    def kills(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._kills)

    def _destroy(self, inst: Instance | None, vast_id: int | None) -> None:
        assert self.destroy_command is not None
        env = {
            **os.environ,
            "CUZK_SIM_UUID": inst.uuid if inst else "",
            "CUZK_SIM_LABEL": inst.label if inst else "",
            "CUZK_SIM_RUNNER_ID": str(inst.runner_id) if inst else "",
            "CUZK_SIM_KILL_REASON": (inst.kill_reason or "") if inst else "",
            "CUZK_SIM_VAST_ID": "" if vast_id is None else str(vast_id),
        }
        try:
            subprocess.run(self.destroy_command, shell=True, env=env, check=False, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            sys.stderr.write(f"sim-manager: destroy command failed: {exc}\n")

    def _vast_destroy(self, vast_id: int) -> None:
        assert self.vast is not None
        try:
            self.vast.destroy(vast_id)
        except VastError as exc:
            self.log(f"[monitor] destroy vast instance {vast_id} failed: {exc}")

    # --- deploys -------------------------------------------------------------------------
    def deploy(self, offer_id: int, min_rate: float) -> tuple[int | None, str | None]:
        """``create instance`` for ``offer_id``: (instance id, None) or (None, reason)."""
        assert self.vast is not None
        pavail = os.environ.get("PAVAIL", "")
        server = os.environ.get("PAVAIL_SERVER", "")
        try:
            instance_id: int | None = self.vast.create(
                offer_id, min_rate, pavail, server, self.create_timeout
            )
            reason: str | None = None
        except VastError as exc:
            instance_id, reason = None, str(exc)
        with self._lock:
            self._deploys.append(
                {
                    "offer_id": offer_id,
                    "min_rate": min_rate,
                    "instance_id": instance_id,
                    "ok": instance_id is not None,
                }
            )
        if instance_id is not None:
            self.log(
                f"[deploy] offer={offer_id} image={self.vast.image} min_rate={min_rate:.1f} "
                f"instance={instance_id}"
            )
        else:
            self.log(f"[deploy] offer={offer_id} min_rate={min_rate:.1f} failed: {reason}")
        return instance_id, reason

    def deploys(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(d) for d in self._deploys]
