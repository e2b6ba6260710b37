"""Errors that end a command with a one-line message and a documented exit code."""

from __future__ import annotations

from cuzk_supervisor import exitcodes


class UsageError(Exception):
    """Bad input or bad configuration: one line to the operator, exit code 2, nothing half-done."""

    exit_code = exitcodes.USAGE
