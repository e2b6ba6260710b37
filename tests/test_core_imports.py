"""core/ is pure (docs/architecture.md, rule 1): it imports nothing from the rest of the package and
nothing that does I/O, reads a clock or draws random numbers.

Every module of cuzk_supervisor/core is parsed (not imported) and each import checked against an
allowlist of pure standard-library modules. A module that is not on the list fails the test even
when it is harmless: adding it here is the moment to decide that it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cuzk_supervisor.core

CORE = Path(cuzk_supervisor.core.__file__).parent
MODULES = sorted(CORE.glob("*.py"))

PURE_STDLIB = frozenset({
    "__future__", "abc", "bisect", "collections", "collections.abc", "contextlib",
    "dataclasses", "datetime", "decimal", "enum", "fractions", "functools", "heapq",
    "itertools", "math", "numbers", "operator", "re", "statistics", "string", "types",
    "typing",
})  # fmt: skip
"""Modules a pure module may import. ``datetime`` is for parsing and formatting given times: a
call that reads the clock is refused below."""

ALLOWED_NAMES = {"signal": frozenset({"Signals"})}
"""Modules of which only these names may be imported: the ``Signals`` enum names a signal
number; ``signal.signal``, ``kill`` and friends are effects."""

FORBIDDEN = frozenset({
    "asyncio", "concurrent", "grpc", "http", "httpx", "importlib", "io", "json", "logging",
    "multiprocessing", "os", "pathlib", "platform", "psutil", "random", "secrets", "select",
    "selectors", "shutil", "signal", "socket", "sqlite3", "ssl", "structlog", "subprocess",
    "sys", "tempfile", "tenacity", "threading", "time", "urllib", "uuid",
})  # fmt: skip
"""Not on the allowlist for a reason worth naming: they do I/O, read a clock, draw random
numbers, or reach the process (``sys``, ``os``, ``signal`` but for the enum above)."""

CLOCK_CALLS = frozenset({"now", "utcnow", "today", "monotonic", "time", "perf_counter"})
"""``datetime.now()`` and friends: the time is an argument in core/, never read."""
FORBIDDEN_BUILTINS = frozenset({"open", "print", "input", "__import__", "exec", "eval"})


def _imports(tree: ast.Module, module: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, imported names) of every import, relative ones resolved."""
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = module.split(".")[: -node.level]
                name = ".".join([*base, name] if name else base)
            found.append((node.lineno, name, tuple(a.name for a in node.names)))
    return found


def _problems(path: Path) -> list[str]:
    module = f"cuzk_supervisor.core.{path.stem}"
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for line, name, names in _imports(tree, module):
        where = f"{path.name}:{line}"
        top = name.split(".")[0]
        if top == "cuzk_supervisor":
            if name != "cuzk_supervisor.core" and not name.startswith("cuzk_supervisor.core."):
                out.append(f"{where}: imports {name}, outside core/")
        elif name in ALLOWED_NAMES:
            extra = set(names) - ALLOWED_NAMES[name]
            if not names or extra:
                out.append(f"{where}: imports {sorted(extra) or 'all'} of {name}")
        elif name in FORBIDDEN or top in FORBIDDEN:
            out.append(f"{where}: imports {name}, which does I/O or reads a clock")
        elif name not in PURE_STDLIB:
            out.append(f"{where}: imports {name}, not on the pure allowlist")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
            out.append(f"{path.name}:{node.lineno}: calls {func.id}()")
        if isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS:
            out.append(f"{path.name}:{node.lineno}: calls .{func.attr}(), a clock")
    return out


def test_core_has_modules() -> None:
    assert {"restart", "plan", "risk", "bench", "exits", "reconcile"} <= {p.stem for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_core_module_is_pure(path: Path) -> None:
    assert _problems(path) == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("import os", "imports os, which does I/O"),
        ("import os.path", "imports os.path, which does I/O"),
        ("from time import monotonic", "imports time, which does I/O"),
        ("import asyncio", "imports asyncio"),
        ("from cuzk_supervisor.adapters.state.store import Report", "outside core/"),
        ("from ..adapters import state", "imports cuzk_supervisor.adapters, outside core/"),
        ("from cuzk_supervisor import errors", "outside core/"),
        ("import signal", "imports all of signal"),
        ("from signal import Signals, signal", "imports ['signal'] of signal"),
        ("import yaml", "not on the pure allowlist"),
        ("x = datetime.now()", "calls .now(), a clock"),
        ("print('x')", "calls print()"),
        ("open('f')", "calls open()"),
    ],
)
def test_the_check_catches(tmp_path: Path, source: str, problem: str) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(source + "\n")
    problems = _problems(bad)
    assert problems
    assert problem in problems[0]


@pytest.mark.parametrize(
    "source",
    [
        "from .checks import require",
        "from cuzk_supervisor.core.units import GIB",
        "from signal import Signals",
        "from collections.abc import Sequence",
        "from datetime import UTC, datetime\nx = datetime.fromisoformat('2025-01-01')",
    ],
)
def test_the_check_lets_pure_imports_through(tmp_path: Path, source: str) -> None:
    good = tmp_path / "good.py"
    good.write_text(source + "\n")
    assert _problems(good) == []


# --- the product does not import the simulator (issue 24) ----------------------------------------

PACKAGE = CORE.parent
SIM_ALLOWED = ("sim/", "cli/commands/sim.py", "cli/simhandoff.py")
"""Where the simulator may be imported: the simulator itself, the ``sim`` command, which hands
its simulated machine to the composition root (``compose.Machine``), and ``cli.simhandoff``,
which hands it to ``run``, ``doctor``, ``plan`` and ``daemon`` only when their daemon is the
simulated one (tests/test_run_imports.py: a real run loads no module of the simulator)."""


def _sim_imports(source: str, module: str) -> list[str]:
    """The simulator's modules ``source`` (module ``module``) imports, anywhere in it."""
    found = _imports(ast.parse(source), module)
    return [
        f"{line}: {name}"
        for line, name, names in found
        if name.startswith("cuzk_supervisor.sim.") or name == "cuzk_supervisor.sim"
        or (name == "cuzk_supervisor" and "sim" in names)
    ]  # fmt: skip


def test_only_the_simulator_and_the_sim_command_import_the_simulator() -> None:
    """docs/architecture.md's layout: the product's wiring does not import the simulator; ``sim``
    (and
    ``cli.simhandoff``) hand its probes in through the composition root
    (``cuzk_supervisor.compose``)."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith(SIM_ALLOWED):
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        problems += [f"{where}:{hit}" for hit in _sim_imports(path.read_text(), module)]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "from cuzk_supervisor.sim.machine import SimMachine",
        "from cuzk_supervisor.sim import probes",
        "from cuzk_supervisor import sim",
        "import cuzk_supervisor.sim.machine.probes",
        "def f():\n    from ..sim import probes",
        "def f():\n    from ..sim.machine import SimMachine",
    ],
)
def test_the_simulator_rule_catches(source: str) -> None:
    assert _sim_imports(source, "cuzk_supervisor.lifecycle.bad")


def test_the_simulator_rule_lets_the_rest_through() -> None:
    source = "from cuzk_supervisor import compose\nfrom ..simple import x\nimport simplejson\n"
    assert _sim_imports(source, "cuzk_supervisor.lifecycle.bad") == []
