"""structlog without rich, and only when it is used: rich is loaded only by the terminal view
(``cli.screen``), structlog only by the modules that log.

``structlog.dev`` imports rich, whenever it is installed, for the tracebacks of its console
renderer, and ``import structlog`` imports ``structlog.dev``. The supervisor never uses those
tracebacks, and rich (with what it pulls in) is about 5 MiB and 90 modules at every start of
every command and of the simulated daemon. So structlog's first import runs with rich marked
absent (structlog then keeps its plain tracebacks), and rich is unmarked right after: the
terminal view imports rich itself when it is shown.

The package installs ``install()`` at its import: a finder that finds nothing itself but wraps
the loader of structlog's first import, wherever that import happens. Importing the package
therefore costs nothing: ``--help``, ``config`` and ``healthcheck`` (the container's
HEALTHCHECK, run every few seconds) never load structlog and asyncio, which it imports.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

NAME = "structlog"

# The finder and the loader are duck-typed, not subclasses of importlib.abc's: importing that
# module loads importlib.resources, about 9 ms at every start of every process of ours.


class _WithoutRich:
    """structlog's own loader, with rich marked absent while the package body runs."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        blocked = "rich" not in sys.modules
        if blocked:
            sys.modules["rich"] = None  # type: ignore[assignment]  # import rich: ImportError
        try:
            self._loader.exec_module(module)
        finally:
            if blocked and "rich" in sys.modules and sys.modules["rich"] is None:
                del sys.modules["rich"]

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _StructlogFinder:
    """Finds only structlog, once, through the other finders, and wraps its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != NAME:
            return None
        uninstall()  # once: later imports (and this lookup) go to the ordinary finders
        spec = importlib.util.find_spec(NAME)
        if spec is None or spec.loader is None or "rich" in sys.modules:
            return spec
        spec.loader = cast("Loader", _WithoutRich(spec.loader))
        return spec


_FINDER = _StructlogFinder()


def install() -> None:
    """Make structlog's first import (whenever it comes) one without rich."""
    if NAME not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
