"""``python -m cuzk_supervisor.sim.daemon``: see :mod:`cuzk_supervisor.sim.daemon.main`."""

import sys

from cuzk_supervisor.sim.daemon.main import main

sys.exit(main())
