"""The simulated manager's monitor, as the real one's: a sweep first at ``first_check`` (10 s),
then every ``check_interval`` (60 s), killing what overstayed a state, benches below min_rate,
what runs on a bad host and, given the platform's instance list (``--instances FILE`` or
``--vastai``'s ``show instances --raw``), every live record that list does not name. The
store applies a pass in one transaction (``Store.sweep``); this module reads the platform's
list, logs and records each kill as the real one does, and runs the loop.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzk_supervisor.sim.manager.instances import Instance, SweepKill, rfc3339
from cuzk_supervisor.sim.manager.platform import Platform, parse_platform, vast_id_from_label
from cuzk_supervisor.sim.manager.store import Store
from cuzk_supervisor.sim.manager.vast import VastCLI

DEFAULT_PARAM_TIMEOUT = 90 * 60.0
DEFAULT_BENCH_TIMEOUT = 45 * 60.0
DEFAULT_CHECK_INTERVAL = 60.0
DEFAULT_FIRST_CHECK = 10.0

Killed = Callable[[Instance | None, str, bool, int | None], None]
"""What is told of a kill: the instance, its cause, whether its container is destroyed, the
platform's instance id (``App.killed``)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The monitor's durations in force (already divided by ``time_scale``)."""

    param: float = DEFAULT_PARAM_TIMEOUT
    bench: float = DEFAULT_BENCH_TIMEOUT
    check_interval: float = DEFAULT_CHECK_INTERVAL
    first_check: float = DEFAULT_FIRST_CHECK
    time_scale: float = 1.0

    @classmethod
    def scaled(
        cls, param: float, bench: float, check_interval: float, first_check: float, scale: float
    ) -> Timeouts:
        return cls(param / scale, bench / scale, check_interval / scale, first_check / scale, scale)

    def to_json(self) -> dict[str, float]:
        return {
            "param": self.param,
            "bench": self.bench,
            "check_interval": self.check_interval,
            "first_check": self.first_check,
            "time_scale": self.time_scale,
        }


class Monitor:
    """One sweep at a time (the loop, ``POST /sim/sweep``), and what ``/sim/state`` shows of
    them: how many, the last one's time and error, the platform's list last read."""

    def __init__(
        self,
        store: Store,
        timeouts: Timeouts,
        log: Callable[[str], None],
        killed: Killed,
        platform_file: Path | None = None,
        vast: VastCLI | None = None,
    ) -> None:
        self.store = store
        self.timeouts = timeouts
        self.log = log
        self.killed = killed
        self.platform_file = platform_file
        self.vast = vast
        self._lock = threading.Lock()
        self._sweep_lock = threading.Lock()  # one sweep at a time (the loop, /sim/sweep)
        self._sweeps: dict[str, Any] = {"count": 0, "last_at": None, "error": None}
        self._platform: Platform | None = None

    def read_platform(self) -> Platform | None:
        """The platform list for this sweep (None: no ``--instances`` nor ``--vastai``).
        ValueError or OSError when it cannot be read: the sweep is then skipped, as the real
        one's."""
        if self.vast is not None:
            return parse_platform(self.vast.show_instances())
        if self.platform_file is None:
            return None
        return parse_platform(self.platform_file.read_text())

    def sweep(self) -> list[SweepKill]:
        """One cycle of the real manager's monitor."""
        with self._sweep_lock:
            try:
                platform = self.read_platform()
            except (OSError, ValueError) as exc:
                message = f"enumerate vast instances: {exc}"
                self.log(f"[monitor] error: {message} (will retry next cycle)")
                self._note_sweep(message)
                return []
            if platform is not None:
                self._platform = platform
                self.log(f"[monitor] cached {len(platform.entries)} vast instances")
            kills = self.store.sweep(self.timeouts.param, self.timeouts.bench, platform)
            for kill in kills:
                inst = kill.instance
                if kill.cause == "disappeared":
                    self.log(
                        f"[monitor] instance disappeared from vast uuid={inst.uuid} "
                        f"label={inst.label} state={kill.state_before}"
                    )
                else:
                    self.log(
                        f"[monitor] killing uuid={inst.uuid} (state={kill.state_before}): "
                        f"{inst.kill_reason}"
                    )
                self.killed(inst, kill.cause, kill.destroyed, self._vast_id(inst, platform))
            self._note_sweep(None)
            return kills

    @staticmethod
    def _vast_id(inst: Instance, platform: Platform | None) -> int | None:
        if platform is not None:
            found = platform.find(inst.label)
            return found.id if found is not None else None
        return vast_id_from_label(inst.label)

    def _note_sweep(self, failure: str | None) -> None:
        with self._lock:
            self._sweeps = {
                "count": self._sweeps["count"] + 1,
                "last_at": rfc3339(time.time()),
                "error": failure,
            }

    def sweeps(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._sweeps)

    def platform(self) -> list[dict[str, Any]] | None:
        if self._platform is None:
            return None
        return [
            {"id": e.id, "label": e.label, "machine_id": e.machine_id}
            for e in self._platform.entries
        ]


def monitor_loop(monitor: Monitor, stop: threading.Event) -> None:
    """First sweep after ``first_check``, then one every ``check_interval``."""
    wait = monitor.timeouts.first_check
    while not stop.wait(wait):
        try:
            monitor.sweep()
        except Exception:  # the next tick tries again
            traceback.print_exc(file=sys.stderr)
        wait = monitor.timeouts.check_interval
