"""Fault switches of the simulated manager: 5xx answers, a proxy's HTML answers (502/503 pages,
a 200 maintenance page), 200s whose body is not the expected JSON, a proxy's throttling (429 or
503 with or without ``Retry-After``, in seconds or as an HTTP-date), a proxy's own pages
(``proxy_rate``/``proxy_next``, the kinds of ``proxy_pages``: HTML, plain and empty 404s,
401/403/405/413/429/502/503 pages, resets; ``proxy``), added latency, refused
connections.

Settings come from ``CUZK_SIM_MANAGER_FAULTS`` (JSON, or ``key=value,key=value``), then the
command line, then ``POST /sim/faults`` at run time. A faulted request is answered before it is
applied, so it never changes state, except a bad body with ``bad_body_applied`` (the manager
applied it, the answer was mangled on the way back). Which requests fail is drawn from one
seeded RNG, one draw per request the rates apply to (and one more to pick the HTML status or
the bad body's kind), so the same requests in the same order fail the same way for a seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from cuzk_supervisor.sim.manager.proxy import (
    BAD_BODY_KINDS,
    MAINTENANCE_PAGE,
    bad_body,
    check_proxy_page,
    proxy_error_page,
    proxy_page,
)

ENV_VAR = "CUZK_SIM_MANAGER_FAULTS"
OUTAGE_MESSAGE = "simulated outage"
LATENCY_PHASES = ("before", "after")
HTML_STATUSES = (502, 503)
# How a throttled answer says when to come back: ``Retry-After: 30``, ``Retry-After: <HTTP-date>``
# (RFC 9110: IMF-fixdate, whole seconds, rounded up so it is never earlier than the delay), or
# no header at all.
RETRY_AFTER_FORMS = ("seconds", "date", "none")


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
    # a proxy in front: this share answered with an HTML error page, status drawn from these
    html_rate: float = 0.0
    html_statuses: tuple[int, ...] = HTML_STATUSES
    # this share answered 200 with a body that is not the expected JSON (kind drawn)
    bad_body_rate: float = 0.0
    bad_body_kinds: tuple[str, ...] = BAD_BODY_KINDS
    bad_body_applied: bool = False  # True: the request is applied, only the answer is bad
    # the next N requests to maintenance_path answered 200 with a "Down for maintenance" page
    maintenance_next: int = 0
    maintenance_path: str = "/register"
    # a proxy's throttling: this share answered ``throttle_status`` (429 or 503) with its HTML
    # page and a Retry-After of ``retry_after`` seconds, in the form ``retry_after_form``
    throttle_rate: float = 0.0
    throttle_status: int = 429
    retry_after: float = 30.0
    retry_after_form: str = "seconds"
    # a proxy's own pages (proxy): this share, or the next N, answered with one drawn
    # among ``proxy_pages``
    proxy_rate: float = 0.0
    proxy_next: int = 0
    proxy_pages: tuple[str, ...] = ("html404", "html403")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("paths", "html_statuses", "bad_body_kinds", "proxy_pages"):
            out[key] = list(getattr(self, key))
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


def _items(key: str, value: Any) -> list[Any]:
    """A list, or its text form: items separated by ``;``, ``,`` or spaces."""
    if isinstance(value, str):
        return [item for item in value.replace(";", " ").replace(",", " ").split() if item]
    if isinstance(value, list | tuple):
        return list(value)
    raise FaultError(f"{key}: expected a list, got {value!r}")


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise FaultError(f"{key}: expected true or false, got {value!r}")


def validate(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Check and normalise a set of changes (keys of FaultSettings, plus ``refuse_for`` and
    ``throttle_for`` in seconds, actions rather than settings). Unknown keys are an error."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key in ("fail_rate", "html_rate", "bad_body_rate", "throttle_rate", "proxy_rate"):
            out[key] = _number(key, value, maximum=1.0)
        elif key == "html_statuses":
            statuses = tuple(
                _integer(key, item, minimum=400, maximum=599) for item in _items(key, value)
            )
            if not statuses:
                raise FaultError(f"{key}: expected at least one status")
            out[key] = statuses
        elif key == "bad_body_kinds":
            kinds = tuple(str(item) for item in _items(key, value))
            unknown = [kind for kind in kinds if kind not in BAD_BODY_KINDS]
            if unknown or not kinds:
                raise FaultError(f"{key}: expected some of {', '.join(BAD_BODY_KINDS)}")
            out[key] = kinds
        elif key == "proxy_pages":
            try:
                pages = tuple(check_proxy_page(str(item)) for item in _items(key, value))
            except ValueError as exc:
                raise FaultError(f"{key}: {exc}") from None
            if not pages:
                raise FaultError(f"{key}: expected at least one page")
            out[key] = pages
        elif key == "bad_body_applied":
            out[key] = _boolean(key, value)
        elif key == "maintenance_next":
            out[key] = _integer(key, value)
        elif key == "maintenance_path":
            if not isinstance(value, str) or not value.startswith("/"):
                raise FaultError(f"{key}: {value!r} is not a path starting with /")
            out[key] = value
        elif key in ("fail_status", "throttle_status"):
            out[key] = _integer(key, value, minimum=400, maximum=599)
        elif key == "retry_after":
            out[key] = _number(key, value, maximum=24 * 3600.0)
        elif key == "retry_after_form":
            if value not in RETRY_AFTER_FORMS:
                raise FaultError(f"{key}: expected one of {RETRY_AFTER_FORMS}, got {value!r}")
            out[key] = value
        elif key in ("fail_next", "proxy_next"):
            out[key] = _integer(key, value)
        elif key == "paths":
            out[key] = _paths(value)
        elif key in ("latency", "refuse_for", "throttle_for"):
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


PASS_KIND = "pass"
ERROR_KIND = "error"  # fail_status with the JSON outage error
HTML_KIND = "html"  # a proxy's HTML error page
BAD_BODY_KIND = "bad_body"  # a 200 whose body is not the expected JSON
MAINTENANCE_KIND = "maintenance"  # a 200 HTML maintenance page
THROTTLE_KIND = "throttle"  # a proxy's 429 (or 503) page, with Retry-After as set
PROXY_KIND = "proxy"  # a proxy's own page (proxy), ``body`` names it


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one request: answer it as ``kind`` says (with ``status``; ``body`` the
    bad body's kind), apply it or not, and how long to wait first (before applying it) and
    last (after applying it, before answering)."""

    fail: bool = False  # answered by a fault
    status: int = 503
    delay_before: float = 0.0
    delay_after: float = 0.0
    kind: str = PASS_KIND
    apply: bool = True  # whether the request reaches the handler (and may change state)
    body: str = ""  # BAD_BODY_KIND: which bad body
    retry_after: float = 0.0  # THROTTLE_KIND: the delay asked for, in seconds
    retry_after_form: str = "none"  # THROTTLE_KIND: how it is written (RETRY_AFTER_FORMS)

    def response(self) -> tuple[int, bytes, str | None]:
        """Status, body and Content-Type of a faulted answer (not for ``error``, which the
        server writes as its own JSON error, nor a proxy's reset)."""
        if self.kind == PROXY_KIND:
            status, body, content_type, _ = proxy_page(self.body)
            return status, body, content_type
        if self.kind in (HTML_KIND, THROTTLE_KIND):
            return self.status, proxy_error_page(self.status).encode(), "text/html"
        if self.kind == MAINTENANCE_KIND:
            return 200, MAINTENANCE_PAGE.encode(), "text/html; charset=utf-8"
        if self.kind == BAD_BODY_KIND:
            body, content_type = bad_body(self.body)
            return 200, body, content_type
        raise ValueError(f"no canned answer for {self.kind!r}")

    def headers(self) -> dict[str, str]:
        """Headers of a faulted answer beyond its type (a proxy page's ``Server``)."""
        return proxy_page(self.body)[3] if self.kind == PROXY_KIND else {}


PASS = Decision()


class Faults:
    """The live switches, shared by the handler threads."""

    def __init__(self, settings: FaultSettings, throttle_for: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._settings = settings
        self._rng = random.Random()
        self._reseed(settings.seed)
        self._throttle_until: float | None = None
        if throttle_for > 0:
            self._throttle_until = time.monotonic() + throttle_for

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
        RNG, even the same seed. ``throttle_for`` (seconds > 0) turns ``throttle_rate`` back to
        0 that long from now; a ``throttle_rate`` set without it throttles until told
        otherwise."""
        fields = {k: v for k, v in changes.items() if k not in ("refuse_for", "throttle_for")}
        with self._lock:
            self._settings = replace(self._settings, **fields)
            if "seed" in fields:
                self._reseed(fields["seed"])
            throttle_for = changes.get("throttle_for")
            if throttle_for is not None and throttle_for > 0:
                self._throttle_until = time.monotonic() + float(throttle_for)
            elif "throttle_rate" in fields:
                self._throttle_until = None
            return self._settings

    @property
    def throttle_left(self) -> float | None:
        """Seconds until the throttling set with ``throttle_for`` ends (None: no such end)."""
        with self._lock:
            self._expire_throttle()
            if self._throttle_until is None:
                return None
            return max(0.0, self._throttle_until - time.monotonic())

    def _expire_throttle(self) -> None:
        """Under the lock: a ``throttle_for`` window that ended turns the throttling off."""
        if self._throttle_until is not None and time.monotonic() >= self._throttle_until:
            self._throttle_until = None
            self._settings = replace(self._settings, throttle_rate=0.0)

    @staticmethod
    def _matches(paths: tuple[str, ...], path: str) -> bool:
        return not paths or any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)

    def decide(self, path: str) -> Decision:
        """The fate of one request to ``path``: a maintenance page first (its own path and
        count, whatever ``paths`` says), then ``fail_next``, then ``proxy_next``, then one draw
        shared by the rates (``fail_rate``, then ``html_rate``, then ``bad_body_rate``, then
        ``throttle_rate``, then ``proxy_rate``, stacked in that order)."""
        with self._lock:
            self._expire_throttle()
            s = self._settings
            if s.maintenance_next > 0 and path == s.maintenance_path:
                self._settings = replace(s, maintenance_next=s.maintenance_next - 1)
                return Decision(fail=True, status=200, kind=MAINTENANCE_KIND, apply=False)
            if not self._matches(s.paths, path):
                return PASS
            kind, status, body = PASS_KIND, s.fail_status, ""
            if s.fail_next > 0:
                self._settings = replace(s, fail_next=s.fail_next - 1)
                kind = ERROR_KIND
            elif s.proxy_next > 0:
                self._settings = replace(s, proxy_next=s.proxy_next - 1)
                kind, body = PROXY_KIND, self._rng.choice(s.proxy_pages)
            elif s.fail_rate or s.html_rate or s.bad_body_rate or s.throttle_rate or s.proxy_rate:
                draw = self._rng.random()
                if draw < s.fail_rate:
                    kind = ERROR_KIND
                elif draw < s.fail_rate + s.html_rate:
                    kind, status = HTML_KIND, self._rng.choice(s.html_statuses)
                elif draw < s.fail_rate + s.html_rate + s.bad_body_rate:
                    kind, status = BAD_BODY_KIND, 200
                    body = self._rng.choice(s.bad_body_kinds)
                elif draw < s.fail_rate + s.html_rate + s.bad_body_rate + s.throttle_rate:
                    kind, status = THROTTLE_KIND, s.throttle_status
                elif draw < (s.fail_rate + s.html_rate + s.bad_body_rate + s.throttle_rate
                             + s.proxy_rate):  # fmt: skip
                    kind, body = PROXY_KIND, self._rng.choice(s.proxy_pages)
        before = s.latency if s.latency_phase == "before" else 0.0
        after = s.latency if s.latency_phase == "after" else 0.0
        fail = kind != PASS_KIND
        apply = not fail or (kind == BAD_BODY_KIND and s.bad_body_applied)
        if kind == PROXY_KIND:  # a proxy answers at once, and never applies it
            return Decision(True, 0, 0.0, 0.0, kind, False, body)
        if kind == THROTTLE_KIND:  # a proxy answers at once: no latency of the manager's
            return Decision(
                True, status, 0.0, 0.0, kind, False, "", s.retry_after, s.retry_after_form
            )
        return Decision(fail, status, before, after, kind, apply, body)
