"""Scaled time for one process: ``time.monotonic`` and ``time.time`` run ``scale`` times faster
than the real clocks, and an asyncio loop whose waits are scaled to match (``scaled_loop``).

Imported for its effect, before anything that reads the clocks: the product's components take
``clock=time.monotonic`` as a default argument (bound when their module is imported) and also
call ``time.monotonic()`` directly (the manager client, the outbox, the log shipper), tenacity
stamps its attempts with ``time.monotonic()``, and asyncio's loop reads ``time.monotonic()``
for every timer. Replacing the two functions in the ``time`` module before those imports makes
all of them read the one scaled clock; the loop's selector divides its real wait by the scale,
so ``asyncio.sleep(60)`` takes ``60 / scale`` real seconds and ends at virtual +60 s.

The scale can change while running (``set_scale``): virtual time stays continuous. At scale 1
(the default until a benchmark sets one) both clocks read the real time. ``govern`` (a task)
slows the clock down while the loop lags behind, and back up when it keeps up.

``time.sleep``, ``threading`` waits and other processes keep real time: a simulated manager in
another process sees real seconds (it has its own ``--time-scale`` for its monitor).
"""

from __future__ import annotations

import asyncio
import os
import selectors
import sys
import threading
import time
from typing import Any

_real_monotonic = time.monotonic
_real_time = time.time

# Modules that bind ``time.monotonic`` as a default argument when imported: already imported,
# they would keep the real clock.
_BINDERS = (
    "cuzk_supervisor.adapters.manager.client",
    "cuzk_supervisor.adapters.logship.shipper",
    "cuzk_supervisor.lifecycle.reporting",
    "cuzk_supervisor.lifecycle.monitors",
)


class ScaledClock:
    """Virtual monotonic and wall clocks running ``scale`` times faster than real time.

    ``scale`` is the one in effect: the one asked for (``set_scale``) times ``factor`` (1 but
    while ``govern`` slows the clock down: a process that cannot keep up with what it
    simulates would otherwise make every wait look longer than it was to the one waiting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scale = 1.0
        self.asked = 1.0  # the scale asked for
        self.factor = 1.0  # the governor's slow-down, in (0, 1]
        self.held = 0  # > 0: the governor leaves the factor as it is
        self._real0 = _real_monotonic()
        self._virtual0 = self._real0
        self._wall_offset = _real_time() - self._real0

    def monotonic(self) -> float:
        return self._virtual0 + (_real_monotonic() - self._real0) * self.scale

    def time(self) -> float:
        return self.monotonic() + self._wall_offset

    def set_scale(self, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"time scale must be > 0, got {scale!r}")
        self.asked = float(scale)
        self._apply()

    def set_factor(self, factor: float) -> None:
        self.factor = max(MIN_FACTOR, min(1.0, factor))
        self._apply()

    def _apply(self) -> None:
        with self._lock:
            now_real = _real_monotonic()
            self._virtual0 = self._virtual0 + (now_real - self._real0) * self.scale
            self._real0 = now_real
            self.scale = self.asked * self.factor

    def real_seconds(self, virtual_s: float) -> float:
        return virtual_s / self.scale


# httpcore asks ``import sniffio`` at every lock it makes (one per connection and request);
# without sniffio installed (it is a dependency now: an older environment), each failed import
# walks sys.path again (a sixth of the CPU of a 200-machine fleet). A None entry then makes
# that import fail at once, with the same outcome (httpcore assumes asyncio).
try:
    import sniffio  # noqa: F401
except ImportError:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

CLOCK = ScaledClock()
PATCHED_LATE = [name for name in _BINDERS if name in sys.modules]
time.monotonic = CLOCK.monotonic
time.time = CLOCK.time


MIN_FACTOR = 0.02
_TRACE = bool(os.environ.get("FLEET_GOVERN_TRACE"))  # a line per look, for tuning
GOVERN_EVERY_S = 0.05  # real seconds between two looks at the loop's lag
LAG_HIGH_S = 0.5  # virtual lag above which the clock slows down ...
LAG_LOW_S = 0.15  # ... and below which it speeds up again, towards the scale asked for


WAIT_OK_S = 1.0  # virtual seconds a request may wait for its answer before the clock slows
WAIT_MIN_FACTOR = 0.1  # ... but a slow answer alone slows it to this share of the scale at most
INFLIGHT: dict[int, float] = {}
"""Requests waiting for their answer: a key of the caller's, the real time each was sent."""


def oldest_wait_s() -> float:
    """Real seconds the oldest request still in flight has waited (0: none)."""
    if not INFLIGHT:
        return 0.0
    return _real_monotonic() - min(INFLIGHT.values())


async def govern(stats: dict[str, float] | None = None) -> None:
    """Slow the virtual clock while the loop lags, so that no wait lasts longer, in virtual
    time, than the process's own delay makes it: with N machines in one process, a burst (a
    fleet started in the same second, a recovery) costs more CPU per real second than there
    is; at the scale asked for every timeout would then fire on answers that came in time, and
    every retry add to the burst. A lag over ``LAG_HIGH_S`` virtual seconds (the real lag
    times the scale) slows the clock; under ``LAG_LOW_S`` it speeds up again, up to the scale
    asked for. Run as a task; cancel it to stop.
    ``stats`` (optional) gathers the real seconds spent slowed down and the lowest factor.

    A manager answering slower than ``WAIT_OK_S`` virtual seconds (``INFLIGHT``, kept by the
    caller) is treated as lag too: the simulated manager shares this host's two cores with
    the fleet, and its real delay, times the scale, would otherwise read as a manager many
    times slower than it is."""
    while True:
        asked = _real_monotonic()
        await asyncio.sleep(GOVERN_EVERY_S * CLOCK.scale)  # GOVERN_EVERY_S real seconds
        lag = _real_monotonic() - asked - GOVERN_EVERY_S
        if CLOCK.factor > WAIT_MIN_FACTOR:
            # Not below: a slower clock makes a request that hangs wait longer still, in real
            # time, for its (virtual) timeout; the loop's own lag alone may go further.
            lag = max(lag, oldest_wait_s() - WAIT_OK_S / CLOCK.scale)
        if CLOCK.held:
            continue
        high, low = LAG_HIGH_S / CLOCK.scale, LAG_LOW_S / CLOCK.scale  # in real seconds
        if lag > high:
            CLOCK.set_factor(CLOCK.factor * max(0.3, min(0.8, high / lag)))
        elif lag < low and CLOCK.factor < 1.0:
            CLOCK.set_factor(CLOCK.factor * 1.05)
        if _TRACE:
            print(f"govern real={_real_monotonic():.1f} lag={lag:.3f} factor={CLOCK.factor:.3f}")
        if stats is not None and CLOCK.factor < 1.0:
            stats["slowed_real_s"] = stats.get("slowed_real_s", 0.0) + GOVERN_EVERY_S + lag
            stats["min_factor"] = min(stats.get("min_factor", 1.0), CLOCK.factor)


class _ScaledSelector(selectors.DefaultSelector):
    """The loop's selector: a wait of ``timeout`` virtual seconds lasts ``timeout / scale``."""

    def select(self, timeout: float | None = None) -> Any:
        if timeout is not None and timeout > 0:
            timeout = timeout / CLOCK.scale
        return super().select(timeout)


def scaled_loop() -> asyncio.AbstractEventLoop:
    """A new event loop on the scaled clock (its ``time()`` is ``time.monotonic()``)."""
    return asyncio.SelectorEventLoop(_ScaledSelector())


def real_monotonic() -> float:
    return _real_monotonic()


def real_time() -> float:
    return _real_time()
