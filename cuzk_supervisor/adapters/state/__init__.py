"""The state file: its store (atomic writes, the lock), its document, and its fields."""
