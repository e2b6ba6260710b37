"""The state file: its store (atomic writes, the lock), its document, and its fields."""

STATE_FILE = "state.json"
"""The state file in ``state_dir`` (``run`` keeps it there; ``doctor`` and the check before
``run`` look at it)."""
