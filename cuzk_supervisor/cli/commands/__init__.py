"""Subcommands. Each module has ``register(subparsers)`` which sets ``handler`` on its parser.

The list of commands is ``cuzk_supervisor.cli.main.COMMANDS``, which imports only the module of
the command given: nothing is imported here, so that importing one command (``run``) does not
load the others (the simulator, the prover, the doctor).
"""
