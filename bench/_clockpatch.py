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
(the default until a benchmark sets one) both clocks read the real time.

``time.sleep``, ``threading`` waits and other processes keep real time: a simulated manager in
another process sees real seconds (it has its own ``--time-scale`` for its monitor).
"""

from __future__ import annotations

import asyncio
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
    """Virtual monotonic and wall clocks running ``scale`` times faster than real time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scale = 1.0
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
        with self._lock:
            now_real = _real_monotonic()
            self._virtual0 = self._virtual0 + (now_real - self._real0) * self.scale
            self._real0 = now_real
            self.scale = float(scale)

    def real_seconds(self, virtual_s: float) -> float:
        return virtual_s / self.scale


# httpcore asks ``import sniffio`` at every lock it makes (one per connection and request);
# without sniffio installed, each failed import walks sys.path again (a sixth of the CPU of a
# 200-machine fleet). A None entry makes that import fail at once, with the same outcome
# (httpcore then assumes asyncio). Where sniffio is installed this changes nothing.
sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

CLOCK = ScaledClock()
PATCHED_LATE = [name for name in _BINDERS if name in sys.modules]
time.monotonic = CLOCK.monotonic
time.time = CLOCK.time


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
