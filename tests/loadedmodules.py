"""Run a module as ``python -m`` would, then write the names in ``sys.modules`` to a file.

    python tests/loadedmodules.py OUT PYTHON -m MODULE [ARGS ...]

``PYTHON`` is ignored (the interpreter is this one): the form lets ``daemonhelpers.Supervisor``
start a command through it with ``prefix=[sys.executable, __file__, OUT]``. The list is written
at exit (``atexit``, which ``runtime.end_settled`` runs too), one name a line, so it holds
everything the command loaded from its start to its stop. Nothing of this is in the product:
a test reads what a real ``run`` loads without a hook of the supervisor's own.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path


def _write(out: Path) -> None:
    out.write_text("".join(f"{name}\n" for name in sorted(sys.modules)))


def main() -> None:
    out, _python, flag, module, *args = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(f"usage: {sys.argv[0]} OUT PYTHON -m MODULE [ARGS ...]")
    atexit.register(_write, Path(out))
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()  # as ``python -m`` has it (not this script's folder)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
