"""Subcommands. Each module has ``register(subparsers)`` which sets ``handler`` on its parser.

Nothing is imported here: ``cuzk_supervisor.cli.main.COMMANDS`` imports only the command given.
"""
