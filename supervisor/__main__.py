"""``python -m supervisor`` is the same as the ``cuzk-supervisor`` command."""

import sys

from supervisor.cli import main

sys.exit(main())
