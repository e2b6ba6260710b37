"""How a setting is declared, the groups it belongs to, and what every part of ``settings`` shares.

A setting is a field of ``Settings`` made by ``setting()``: its default, its help text, its limits
and its group. A group says what the settings in it are for; each command takes the groups it
reads (``flags.add_flags``) and docs/configuration.md lists them group by group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ENV_PREFIX = "CUZK_SUPERVISOR_"
CONFIG_FILE_ENV = f"{ENV_PREFIX}CONFIG_FILE"
# The settings an operator baked into the image at build time (``docker build --build-arg
# CUZK_MANAGER_URL=...``, written by ``settings.bake``): below every other source, above the
# defaults. A fixed path, so that a supervisor started by the platform's on-start hook (which
# passes no manager URL) still finds its manager. The variable moves it (tests, other layouts).
IMAGE_SETTINGS_FILE = "/etc/cuzk-supervisor/settings.toml"
IMAGE_SETTINGS_FILE_ENV = f"{ENV_PREFIX}IMAGE_SETTINGS_FILE"
REDACTED = "***"

LOG_LEVELS = ("debug", "info", "warning", "error")

DAY_S = 86_400.0
HOUR_S = 3_600.0
# Longest raw value read from any source, before it is parsed (a list, a command, a URL).
MAX_RAW_CHARS = 16_384
# Longest settings file read (a few KB is a long one).
MAX_SETTINGS_FILE_BYTES = 1 << 20
MAX_LIST_ITEMS = 256

GROUPS: dict[str, str] = {
    "manager": "registration, reports, status and log lines",
    "logging": "the supervisor's own log lines",
    "folders": "where the supervisor keeps its files",
    "daemon": "binary, addresses, parameter cache, its log",
    "supervision": "start, stop, liveness, restarts, OOM",
    "memory": "the worker plan: memory and GPUs, the rule",
    "proving": "the C1 input and the deadlines of a proof",
    "params": "fetching and checking the proof parameters",
    "bench": "warmup, settle and bench: the rate measurement",
    "run": "the run phase",
    "health": "the health server: /healthz /readyz /metrics",
}
"""Every group, in the order help and docs/configuration.md show them, with what its settings
are for."""


def setting(
    default: Any,
    help: str,
    *,
    group: str,
    secret: bool = False,
    choices: Sequence[str] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    form: str | None = None,
    max_length: int = 4096,
    metavar: str | None = None,
) -> Any:
    """Declare one setting (a dataclass field with its documentation and limits).

    ``group`` is a key of ``GROUPS``; ``form`` names the text rule a str setting follows (see
    ``values``); ``max_length`` bounds every text value (each item of a list); ``metavar`` is the
    value's name in help when the rule in ``flags.metavar`` does not fit."""
    if group not in GROUPS:
        raise ValueError(f"unknown settings group {group!r}")
    return field(
        default=default,
        metadata={
            "help": help,
            "secret": secret,
            "choices": tuple(choices) if choices else None,
            "minimum": minimum,
            "maximum": maximum,
            "form": form,
            "max_length": max_length,
            "group": group,
            "metavar": metavar,
        },
    )


def redact_url(url: str) -> str:
    """Drop the password (and query, which may carry tokens) from a URL for display."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", f":{REDACTED}@")
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
