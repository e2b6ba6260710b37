"""Whether the fleet manager can match this instance's label to a platform instance.

The real manager's sweep lists the platform's instances every 60 s and kills a registered
record whose instance is not in that list. It matches by the platform's own label (often
empty: it needs ``vastai label instance``) and then by the id in a ``C.<digits>`` label, the
form the platform gives in ``VAST_CONTAINERLABEL``. A label of another form is therefore killed
at the first sweep ("instance disappeared from vast") although the machine is healthy.
"""

from __future__ import annotations

import re

PLATFORM_LABEL_RE = re.compile(r"C\.\d+")


def is_platform_label(label: str) -> bool:
    """``C.<digits>``, as the platform names a container (``C.12345678``)."""
    return PLATFORM_LABEL_RE.fullmatch(label) is not None


def label_warning(label: str, manager_url: str) -> str | None:
    """The one warning to give at start, or None: with a manager URL set, a label not ``C.<digits>``
    cannot be matched by the manager's sweep; without one (a local run) any label is fine."""
    if not manager_url.strip() or is_platform_label(label):
        return None
    return (
        f"label {label!r} is not of the form C.<digits>: the fleet manager's sweep matches a "
        "registered instance to the platform's list by that id (or by a platform label set "
        "with `vastai label instance`), and kills one it cannot match ('instance disappeared "
        "from vast'); use the platform's VAST_CONTAINERLABEL"
    )
