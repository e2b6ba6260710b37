"""``python -m cuzk_supervisor.sim.manager``: see :mod:`cuzk_supervisor.sim.manager.main`."""

import sys

from cuzk_supervisor.sim.manager.main import main

sys.exit(main())
