"""The environment every child gets (the daemon, the params fetch, the worker commands).

Children get what they need, not the supervisor's secrets: every ``*_TOKEN`` variable and every
setting marked secret is removed, and so is a URL setting (``CUZK_SUPERVISOR_MANAGER_URL``) that
carries a password or a query. Every spawner uses it (and ``reaper.Reaper.spawn`` applies it again
to whatever it is given, so no child started through the reaper can miss it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cuzk_supervisor import settings


def secret_names() -> frozenset[str]:
    """The variables of the settings marked secret (``CUZK_SUPERVISOR_MANAGER_TOKEN``, …)."""
    return frozenset(decl.env for decl in settings.declarations() if decl.secret)


def is_secret_name(name: str, secret: frozenset[str] | None = None) -> bool:
    """A variable the supervisor keeps to itself: ``*_TOKEN`` or a secret setting's variable."""
    upper = name.upper()
    return upper.endswith("_TOKEN") or upper in (secret_names() if secret is None else secret)


def child_environ(
    extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: this process's environment) plus ``extra``, secrets removed."""
    merged = {**(os.environ if base is None else base), **(extra or {})}
    secret = secret_names()
    return {
        name: value
        for name, value in merged.items()
        if not is_secret_name(name, secret) and not _url_with_credentials(name, value)
    }


def _url_with_credentials(name: str, value: str) -> bool:
    """A URL setting's variable whose value carries a password or a query (as a token may)."""
    if not (name.startswith(settings.ENV_PREFIX) and name.endswith("_URL")):
        return False
    try:
        return settings.redact_url(value) != value
    except ValueError:
        return True  # not even a URL: not ours to pass on
