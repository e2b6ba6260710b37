"""Subcommands. Each module has ``register(subparsers)`` which sets ``handler`` on its parser."""

from __future__ import annotations

from types import ModuleType

from supervisor.commands import prove

COMMANDS: list[ModuleType] = [prove]
