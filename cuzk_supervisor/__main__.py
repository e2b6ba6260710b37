"""``python -m cuzk_supervisor`` is the same as the ``cuzk-supervisor`` command."""

from cuzk_supervisor.cli.main import entry

entry()
