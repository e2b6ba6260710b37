"""structlog without rich: rich is loaded only by the terminal view (``cli.screen``).

``structlog.dev`` imports rich, whenever it is installed, for the tracebacks of its console
renderer, and ``import structlog`` imports ``structlog.dev``. The supervisor never uses those
tracebacks, and rich (with what it pulls in) is about 5 MiB and 90 modules at every start of
every command and of the simulated daemon. So the package imports structlog first with rich
marked absent for that one import (structlog then keeps its plain tracebacks), and unmarks it:
the terminal view imports rich itself when it is shown.
"""

from __future__ import annotations

import sys


def import_structlog() -> None:
    """Import structlog (once) so that it does not load rich."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # import rich: ImportError, at once
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]
