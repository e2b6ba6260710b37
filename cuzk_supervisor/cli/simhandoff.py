"""The machine a product command measures: the host's, or the simulated one when its daemon is.

``run``, ``doctor``, ``plan`` and ``daemon`` measure the host (``compose.HOST``), unless their
daemon is the simulated one (``daemon.simulated.sim_daemon_argv``: the image without a GPU, or
the demo's settings given to ``run``). Only then is the simulator imported (``sim.machine
.probes``): a run against a real daemon loads no module of ``cuzk_supervisor.sim``
(tests/test_run_imports.py). This module and ``cli/commands/sim.py`` are the only ones outside
``sim/`` that import the simulator (tests/test_core_imports.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cuzk_supervisor.daemon.simulated import sim_daemon_argv

if TYPE_CHECKING:
    from cuzk_supervisor.compose import Machine
    from cuzk_supervisor.settings import Settings


def machine_for(s: Settings, environ: Mapping[str, str] = os.environ) -> Machine:
    """``environ`` gives the simulated daemon's ``CUZK_SIM_*`` defaults."""
    if sim_daemon_argv(s.daemon_binary, s.daemon_args) is None:
        from cuzk_supervisor.compose import HOST

        return HOST
    from cuzk_supervisor.sim.machine.probes import machine

    return machine(environ)
