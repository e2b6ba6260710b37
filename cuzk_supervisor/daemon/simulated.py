"""Whether the configured daemon is the simulated one, read from its binary and arguments alone.

The one fact about the simulator the product's commands need before they may import it
(``cli.simhandoff``): ``run``, ``doctor``, ``plan`` and ``daemon`` measure the simulated machine
only when their daemon is the simulator (its console script, or ``-m cuzk_supervisor.sim.daemon``
in its arguments). Standard library only: the simulated daemon reads it too (``sim.machine``),
and a real run must not load the simulator to learn that it is not one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

SIM_DAEMON_MODULE = "cuzk_supervisor.sim.daemon"
SIM_DAEMON_BINARY = "cuzk-sim-daemon"  # the console script (pyproject.toml)


def sim_daemon_argv(binary: str, args: Sequence[str]) -> list[str] | None:
    """The simulated daemon's own arguments when ``binary args`` runs it, else None."""
    if PurePath(binary).name == SIM_DAEMON_BINARY:
        return list(args)
    items = list(args)
    for i, arg in enumerate(items[:-1]):
        if arg == "-m" and items[i + 1] == SIM_DAEMON_MODULE:
            return items[i + 2 :]
    return None
