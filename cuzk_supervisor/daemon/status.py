"""The daemon's own HTTP status (``[daemon] status_listen``, cuzk.md §2): what it is doing now.

Only the one figure the memory fit needs, ``synthesis.active`` (partitions synthesizing). A
short timeout and no retries: a daemon that cannot answer gives no figure, and the caller falls
back to a plain one-worker step.
"""

from __future__ import annotations

import json
import urllib.request

MAX_BODY_BYTES = 1 << 20


def active_partitions(status_listen: str, timeout_s: float = 1.0) -> int | None:
    """``synthesis.active`` from ``http://<status_listen>/status``; None when not known."""
    if not status_listen or status_listen.startswith("unix:"):
        return None
    try:
        with urllib.request.urlopen(f"http://{status_listen}/status", timeout=timeout_s) as resp:
            document = json.loads(resp.read(MAX_BODY_BYTES))
    except (OSError, ValueError):
        return None
    synthesis = document.get("synthesis") if isinstance(document, dict) else None
    active = synthesis.get("active") if isinstance(synthesis, dict) else None
    if isinstance(active, bool) or not isinstance(active, int) or active < 0:
        return None
    return active
