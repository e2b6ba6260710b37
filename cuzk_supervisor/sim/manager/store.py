"""SQLite state of the simulated fleet manager: instances, the runner-id counter, bad hosts.

The rules are the real manager's (``docs/manager-api.md``); every method is one
transaction, so a second sim process on the same file (a restart) sees a consistent state.
Times are unix seconds in the database (with their fraction, so a scaled-down timeout is
exact) and whole seconds ``YYYY-MM-DD HH:MM:SS`` (UTC, SQLite's ``CURRENT_TIMESTAMP``, as the
real manager lists them) in ``GET /status``. The records it hands out are
``instances``'; a sweep's pass is one transaction here, the monitor that runs it
``sweep``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from cuzk_supervisor.sim.manager.instances import (
    BENCH_DONE,
    BENCH_TIMEOUT_REASON,
    DISAPPEARED_REASON,
    KILLED,
    PARAM_TIMEOUT_REASON,
    PARAMS_DONE,
    REGISTERED,
    RUNNING,
    BenchResult,
    Instance,
    SweepKill,
    bench_fail_reason,
    effective_min_rate,
    rfc3339,
    sql_time,
)
from cuzk_supervisor.sim.manager.platform import Platform, vast_id_from_label

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS instances (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid          TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    runner_id     INTEGER NOT NULL,
    state         TEXT NOT NULL,
    min_rate      REAL NOT NULL,
    registered_at REAL NOT NULL,
    param_done_at REAL,
    bench_done_at REAL,
    bench_rate    REAL,
    killed_at     REAL,
    kill_reason   TEXT
);
CREATE INDEX IF NOT EXISTS instances_label ON instances (label, state);
CREATE TABLE IF NOT EXISTS bad_hosts (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  TEXT NOT NULL,
    reason      TEXT NOT NULL,
    reported_at REAL NOT NULL
);
"""
_COLUMNS = (
    "uuid, label, runner_id, state, min_rate, registered_at, param_done_at, bench_done_at, "
    "bench_rate, killed_at, kill_reason"
)


class Store:
    """The manager's database. One connection guarded by a lock (the HTTP server is threaded);
    WAL so a reader in another process never blocks on a writer."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=10.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        self._closed = False

    # --- plumbing ------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction (BEGIN IMMEDIATE: another process on the file waits)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()

    def change_key(self) -> tuple[int, int]:
        """Changes whenever the database may have: a write through this connection
        (``total_changes``) or a commit by another one (``PRAGMA data_version``). For caching
        what is read from it (``GET /status``'s body)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            (version,) = self._conn.execute("PRAGMA data_version").fetchone()
            return self._conn.total_changes, int(version)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    @staticmethod
    def _get(cur: sqlite3.Cursor, uuid: str) -> Instance | None:
        row = cur.execute(f"SELECT {_COLUMNS} FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        return Instance.from_row(row) if row is not None else None

    @staticmethod
    def _kill(cur: sqlite3.Cursor, inst: Instance, reason: str, now: float) -> Instance:
        cur.execute(
            "UPDATE instances SET state = ?, killed_at = ?, kill_reason = ? WHERE uuid = ?",
            (KILLED, now, reason, inst.uuid),
        )
        return replace(inst, state=KILLED, killed_at=now, kill_reason=reason)

    # --- the API's rules -----------------------------------------------------------------
    def register(self, label: str, min_rate: float) -> tuple[Instance, bool]:
        """The live (not killed) instance with ``label`` if there is one (its min_rate kept),
        else a new one with a fresh uuid and the next runner id. ``(instance, created)``."""
        with self._tx() as cur:
            row = cur.execute(
                f"SELECT {_COLUMNS} FROM instances WHERE label = ? AND state != ? "
                "ORDER BY seq DESC LIMIT 1",
                (label, KILLED),
            ).fetchone()
            if row is not None:
                return Instance.from_row(row), False
            cur.execute(
                "INSERT INTO counters (name, value) VALUES ('runner_id', 1) "
                "ON CONFLICT (name) DO UPDATE SET value = value + 1"
            )
            (runner_id,) = cur.execute(
                "SELECT value FROM counters WHERE name = 'runner_id'"
            ).fetchone()
            inst = Instance(
                uuid=str(uuidlib.uuid4()),
                label=label,
                runner_id=int(runner_id),
                state=REGISTERED,
                min_rate=effective_min_rate(min_rate),
                registered_at=self._clock(),
            )
            cur.execute(
                "INSERT INTO instances (uuid, label, runner_id, state, min_rate, registered_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (inst.uuid, label, inst.runner_id, REGISTERED, inst.min_rate, inst.registered_at),
            )
            return inst, True

    def get(self, uuid: str) -> Instance | None:
        with self._tx() as cur:
            return self._get(cur, uuid)

    def param_done(self, uuid: str) -> Instance | None:
        """``registered`` → ``params_done``; any other state unchanged. None: unknown uuid."""
        with self._tx() as cur:
            inst = self._get(cur, uuid)
            if inst is None or inst.state != REGISTERED:
                return inst
            now = self._clock()
            cur.execute(
                "UPDATE instances SET state = ?, param_done_at = ? WHERE uuid = ?",
                (PARAMS_DONE, now, uuid),
            )
            return replace(inst, state=PARAMS_DONE, param_done_at=now)

    def bench_done(self, uuid: str, rate: float) -> BenchResult | None:
        """Pass (``rate >= min_rate``) → ``bench_done`` with the rate; fail → ``killed``.
        The current state is deliberately not checked (the real manager does not)."""
        with self._tx() as cur:
            inst = self._get(cur, uuid)
            if inst is None:
                return None
            now = self._clock()
            if rate >= inst.min_rate:
                cur.execute(
                    "UPDATE instances SET state = ?, bench_done_at = ?, bench_rate = ? "
                    "WHERE uuid = ?",
                    (BENCH_DONE, now, rate, uuid),
                )
                return BenchResult(
                    replace(inst, state=BENCH_DONE, bench_done_at=now, bench_rate=rate), True
                )
            cur.execute(
                "UPDATE instances SET bench_done_at = ?, bench_rate = ? WHERE uuid = ?",
                (now, rate, uuid),
            )
            benched = replace(inst, bench_done_at=now, bench_rate=rate)
            killed = self._kill(cur, benched, bench_fail_reason(rate, inst.min_rate), now)
            return BenchResult(killed, False)

    def running(self, uuid: str) -> Instance | None:
        """Any state but ``killed`` → ``running``. None: unknown or killed."""
        with self._tx() as cur:
            inst = self._get(cur, uuid)
            if inst is None or inst.state == KILLED:
                return None
            cur.execute("UPDATE instances SET state = ? WHERE uuid = ?", (RUNNING, uuid))
            return replace(inst, state=RUNNING)

    def kill(self, uuid: str, reason: str, *, again: bool = True) -> Instance | None:
        """Kill ``uuid`` with ``reason``; a killed one is killed again (new time and reason)
        only with ``again`` (the sim's ``/sim/kill``; the real ``/api/kill`` leaves it).
        None: unknown uuid, or already killed and not ``again``."""
        with self._tx() as cur:
            inst = self._get(cur, uuid)
            if inst is None or (inst.state == KILLED and not again):
                return None
            return self._kill(cur, inst, reason, self._clock())

    def instances(self) -> list[Instance]:
        """Every record, as ``GET /status`` lists them: by runner id, highest first."""
        with self._tx() as cur:
            rows = cur.execute(
                f"SELECT {_COLUMNS} FROM instances ORDER BY runner_id DESC, seq DESC"
            ).fetchall()
        return [Instance.from_row(row) for row in rows]

    def sweep(
        self, param_timeout: float, bench_timeout: float, platform: Platform | None = None
    ) -> list[SweepKill]:
        """One pass of the real manager's monitor, in its order: kill what runs on a bad host
        (a platform list naming machine ids), what overstayed ``registered``
        (``param_timeout``) or ``params_done`` (``bench_timeout``), any ``bench_done`` below
        its min_rate, then (with a platform list) every live record the list does not name.
        A kill destroys the container where the real manager would: when the record is found
        in the platform list, or (no list) when its label is ``C.<digits>``.
        Returns the kills of this pass."""
        kills: list[SweepKill] = []

        def on_platform(label: str) -> bool:
            if platform is None:
                return vast_id_from_label(label) is not None
            return platform.find(label) is not None

        with self._tx() as cur:
            now = self._clock()

            def live() -> list[Instance]:
                rows = cur.execute(
                    f"SELECT {_COLUMNS} FROM instances WHERE state != ? ORDER BY seq", (KILLED,)
                ).fetchall()
                return [Instance.from_row(row) for row in rows]

            def kill_label(label: str, reason: str, cause: str, destroyed: bool) -> None:
                for inst in live():  # every live record with the label, as the real one
                    if inst.label == label:
                        killed = self._kill(cur, inst, reason, now)
                        kills.append(SweepKill(killed, cause, destroyed, inst.state))

            if platform is not None:
                rows = cur.execute("SELECT machine_id, reason FROM bad_hosts").fetchall()
                bad = {str(machine): reason for machine, reason in rows}
                for entry in platform.entries:
                    why = bad.get(str(entry.machine_id))
                    if entry.machine_id is not None and why is not None:
                        reason = f"bad host {entry.machine_id}: {why}"
                        kill_label(entry.label or f"C.{entry.id}", reason, "bad host", True)
            for inst in live():
                if inst.state == REGISTERED and now - inst.registered_at > param_timeout:
                    reason = PARAM_TIMEOUT_REASON
                elif (
                    inst.state == PARAMS_DONE
                    and now - (inst.param_done_at or inst.registered_at) > bench_timeout
                ):
                    reason = BENCH_TIMEOUT_REASON
                else:
                    continue
                kill_label(inst.label, reason, "timeout", on_platform(inst.label))
            for inst in live():
                rate = inst.bench_rate
                if inst.state == BENCH_DONE and rate is not None and rate < inst.min_rate:
                    reason = bench_fail_reason(rate, inst.min_rate)
                    kill_label(inst.label, reason, "bench below min_rate", on_platform(inst.label))
            if platform is not None:
                for inst in live():
                    if platform.find(inst.label) is None:
                        killed = self._kill(cur, inst, DISAPPEARED_REASON, now)
                        kills.append(SweepKill(killed, "disappeared", False, inst.state))
        return kills

    def add_bad_host(self, machine_id: str, reason: str) -> None:
        """Add or replace (one entry per machine id, as the real table's primary key)."""
        with self._tx() as cur:
            cur.execute("DELETE FROM bad_hosts WHERE machine_id = ?", (machine_id,))
            cur.execute(
                "INSERT INTO bad_hosts (machine_id, reason, reported_at) VALUES (?, ?, ?)",
                (machine_id, reason, self._clock()),
            )

    def remove_bad_host(self, machine_id: str) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM bad_hosts WHERE machine_id = ?", (machine_id,))

    def bad_hosts(self) -> list[dict[str, Any]]:
        """In order of arrival (``/sim/state``)."""
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT machine_id, reason, reported_at FROM bad_hosts ORDER BY seq"
            ).fetchall()
        return [{"machine_id": m, "reason": r, "reported_at": rfc3339(t)} for m, r, t in rows]

    def bad_hosts_listed(self) -> list[dict[str, Any]]:
        """As ``GET /bad-host`` lists them: newest first, ``added_at`` in whole seconds."""
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT machine_id, reason, reported_at FROM bad_hosts ORDER BY seq DESC"
            ).fetchall()
        return [{"machine_id": m, "reason": r, "added_at": sql_time(t)} for m, r, t in rows]

    def runner_id_counter(self) -> int:
        """The last runner id handed out (0 before the first register)."""
        with self._tx() as cur:
            row = cur.execute("SELECT value FROM counters WHERE name = 'runner_id'").fetchone()
        return int(row[0]) if row is not None else 0
