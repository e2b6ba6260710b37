"""``python -m cuzk_supervisor`` is the same as the ``cuzk-supervisor`` command."""

import sys

from cuzk_supervisor.cli.main import main

sys.exit(main())
