"""Fault switches of the simulated manager: 5xx answers, added latency, refused connections.

Settings come from ``CUZK_SIM_MANAGER_FAULTS`` (JSON, or ``key=value,key=value``), then the
command line, then ``POST /sim/faults`` at run time. A faulted request is answered before it is
applied, so it never changes state. Which requests fail is drawn from one seeded RNG, one draw
per request the fault applies to, so a run is reproducible from its seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

ENV_VAR = "CUZK_SIM_MANAGER_FAULTS"
OUTAGE_MESSAGE = "simulated outage"
LATENCY_PHASES = ("before", "after")


class FaultError(ValueError):
    """A fault setting that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """Every switch. ``paths`` (exact, or a prefix of whole segments) picks the requests that
    failures and latency apply to; empty: every path outside ``/sim/``."""

    fail_rate: float = 0.0  # share of requests answered ``fail_status`` (RNG draw)
    fail_status: int = 503
    fail_next: int = 0  # the next N matching requests fail, before any draw
    paths: tuple[str, ...] = ()  # "/register", or "/api" for everything under it
    latency: float = 0.0  # seconds added to every matching request
    latency_phase: str = "after"  # "after": state applied, answer late; "before": both late
    seed: int | None = None  # None: a random seed, shown by GET /sim/faults

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["paths"] = list(self.paths)
        return out


def _number(key: str, value: Any, *, minimum: float = 0.0, maximum: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FaultError(f"{key}: expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise FaultError(f"{key}: expected a number, got {value!r}") from None
    if not (minimum <= number <= maximum) or math.isnan(number):
        raise FaultError(f"{key}: {number:g} is outside [{minimum:g}, {maximum:g}]")
    return number


def _integer(key: str, value: Any, *, minimum: int = 0, maximum: int = 2**63 - 1) -> int:
    number = _number(key, value, minimum=minimum, maximum=maximum)
    if number != int(number):
        raise FaultError(f"{key}: expected an integer, got {value!r}")
    return int(number)


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [p for p in value.replace(";", " ").split() if p]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise FaultError(f"paths: expected a list of paths, got {value!r}")
    for item in items:
        if not isinstance(item, str) or not item.startswith("/"):
            raise FaultError(f"paths: {item!r} is not a path starting with /")
    return tuple(items)


def validate(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Check and normalise a set of changes (keys of FaultSettings, plus ``refuse_for``
    in seconds, an action rather than a setting). Unknown keys are an error."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "fail_rate":
            out[key] = _number(key, value, maximum=1.0)
        elif key == "fail_status":
            out[key] = _integer(key, value, minimum=400, maximum=599)
        elif key in ("fail_next",):
            out[key] = _integer(key, value)
        elif key == "paths":
            out[key] = _paths(value)
        elif key in ("latency", "refuse_for"):
            out[key] = _number(key, value, maximum=24 * 3600.0)
        elif key == "latency_phase":
            if value not in LATENCY_PHASES:
                raise FaultError(f"latency_phase: expected one of {LATENCY_PHASES}, got {value!r}")
            out[key] = value
        elif key == "seed":
            out[key] = None if value is None else _integer(key, value, minimum=-(2**63))
        else:
            raise FaultError(f"unknown fault setting {key!r}")
    return out


def parse_text(text: str) -> dict[str, Any]:
    """The environment's form: a JSON object, or ``fail_rate=0.3,seed=7,latency=1``
    (``paths`` then separated by ``;``). Validated."""
    stripped = text.strip()
    if not stripped:
        return {}
    if stripped.startswith("{"):
        try:
            raw = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise FaultError(f"{ENV_VAR}: bad JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise FaultError(f"{ENV_VAR}: expected a JSON object")
        return validate(raw)
    pairs: dict[str, Any] = {}
    for part in stripped.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise FaultError(f"bad fault setting {part!r}: expected key=value")
        pairs[key.strip()] = value.strip()
    return validate(pairs)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one request: fail it (with ``status``), and how long to wait first
    (before applying it) and last (after applying it, before answering)."""

    fail: bool = False
    status: int = 503
    delay_before: float = 0.0
    delay_after: float = 0.0


PASS = Decision()


class Faults:
    """The live switches, shared by the handler threads."""

    def __init__(self, settings: FaultSettings) -> None:
        self._lock = threading.Lock()
        self._settings = settings
        self._rng = random.Random()
        self._reseed(settings.seed)

    def _reseed(self, seed: int | None) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "big")
            self._settings = replace(self._settings, seed=seed)
        self._rng.seed(seed)

    @property
    def settings(self) -> FaultSettings:
        with self._lock:
            return self._settings

    def update(self, changes: Mapping[str, Any]) -> FaultSettings:
        """Apply validated changes (``refuse_for`` is ignored here); a ``seed`` restarts the
        RNG, even the same seed."""
        fields = {k: v for k, v in changes.items() if k != "refuse_for"}
        with self._lock:
            self._settings = replace(self._settings, **fields)
            if "seed" in fields:
                self._reseed(fields["seed"])
            return self._settings

    @staticmethod
    def _matches(paths: tuple[str, ...], path: str) -> bool:
        return not paths or any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)

    def decide(self, path: str) -> Decision:
        with self._lock:
            s = self._settings
            if not self._matches(s.paths, path):
                return PASS
            fail = False
            if s.fail_next > 0:
                self._settings = replace(s, fail_next=s.fail_next - 1)
                fail = True
            elif s.fail_rate > 0:
                fail = self._rng.random() < s.fail_rate
        before = s.latency if s.latency_phase == "before" else 0.0
        after = s.latency if s.latency_phase == "after" else 0.0
        return Decision(fail=fail, status=s.fail_status, delay_before=before, delay_after=after)
