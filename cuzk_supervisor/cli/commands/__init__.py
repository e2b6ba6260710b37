"""Subcommands. Each module has ``register(subparsers)`` which sets ``handler`` on its parser."""

from __future__ import annotations

from types import ModuleType

from cuzk_supervisor.cli.commands import config, daemon, doctor, plan, prove, run, sim

COMMANDS: list[ModuleType] = [run, sim, prove, daemon, plan, doctor, config]
