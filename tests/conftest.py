"""Shared test set-up: the helper modules in tests/ import as plain modules from any subfolder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
