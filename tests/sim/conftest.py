"""Fixtures for the simulator's tests; ``tests/`` goes on sys.path for ``simhelpers``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simhelpers import SimProcess


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., SimProcess]]:
    """``sim_factory(listen=..., config=..., ...)`` starts a sim (``SimProcess.start``'s
    arguments); every one started is SIGKILLed and reaped at teardown."""
    started: list[SimProcess] = []

    def start(**kwargs: Any) -> SimProcess:
        kwargs.setdefault("listen", f"127.0.0.1:{free_port()}")
        sim = SimProcess.start(**kwargs)
        started.append(sim)
        return sim

    from simhelpers import free_tcp_port as free_port

    yield start
    for sim in started:
        sim.kill()
