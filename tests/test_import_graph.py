"""The package's import graph: no circle between two modules, and the layers of
docs/architecture.md (issue 47).

Every module is parsed, not imported, and every ``import`` counted wherever it stands: at the top,
in a function, or under ``TYPE_CHECKING`` (a circle of type hints is still two modules that each
need the other to be read). ``from package import name`` counts as an import of ``package.name``
where that is a module, else of the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import cuzk_supervisor

ROOT = Path(cuzk_supervisor.__file__).parent
PACKAGE = "cuzk_supervisor"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _targets(module: str, path: Path) -> Iterator[str]:
    """The package's modules ``module`` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]  # fmt: skip
        else:
            continue
        yield from (n for n in names if n in MODULES and n != module)


GRAPH = {m: frozenset(_targets(m, p)) for m, p in MODULES.items()}


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_two_modules_import_each_other():
    assert _circles(GRAPH) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
             "d": frozenset({"a"})}  # fmt: skip
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": frozenset({"b"}), "b": frozenset()}) == []


def _layer(module: str) -> str:
    """The room a module is in: its first folder under the package, or its own name."""
    return module.split(".")[1] if "." in module else "(package)"


# What each layer may not import (docs/architecture.md). The composition root (compose,
# composeedges) and the CLI above it may import any layer.
FORBIDDEN: dict[str, frozenset[str]] = {
    "core": frozenset(_layer(m) for m in MODULES) - {"core"},
    "adapters": frozenset({"lifecycle", "serve", "settings", "cli", "compose", "composeedges",
                           "sim"}),
    "daemon": frozenset({"lifecycle", "serve", "cli", "compose", "composeedges", "sim"}),
    "serve": frozenset({"lifecycle", "settings", "cli", "compose", "composeedges", "sim"}),
    # Each lifecycle component is given its own values (lifecycle.values): no settings.
    "lifecycle": frozenset({"settings", "cli", "compose", "composeedges", "sim"}),
    "settings": frozenset({"lifecycle", "cli", "compose", "composeedges", "sim"}),
    # The simulated machine is handed to the composition root as its probes (sim.machine.probes).
    "sim": frozenset({"lifecycle", "cli"}),
}  # fmt: skip
BELOW_ROOT = ("address", "deadline", "errors", "exitcodes", "killtree", "logcontext",
              "logimport", "pid1", "reaper", "runtime", "proto")  # fmt: skip
"""The small shared modules: none imports a layer above it, nor the CLI."""


def _layer_breaches() -> list[str]:
    out: list[str] = []
    for module, targets in GRAPH.items():
        layer = _layer(module)
        banned = FORBIDDEN.get(layer, frozenset())
        if layer in BELOW_ROOT:
            banned = frozenset({"lifecycle", "serve", "cli", "compose", "composeedges", "sim"})
        out.extend(f"{module} imports {t}" for t in sorted(targets) if _layer(t) in banned)
    return out


def test_each_layer_imports_only_what_is_below_it():
    assert _layer_breaches() == []


def test_nothing_below_the_composition_root_imports_the_cli():
    above = {"cli", "__main__", "compose"}
    breaches = [f"{m} imports {t}" for m, targets in GRAPH.items() for t in sorted(targets)
                if _layer(t) == "cli" and _layer(m) not in above]  # fmt: skip
    assert breaches == []


def test_the_graph_reads_imports_under_type_checking_in_functions_and_relative(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from cuzk_supervisor.core.health import Assessment\n"
        "def later() -> None:\n"
        "    import cuzk_supervisor.core.backoff\n"
        "from .core import jitter\n"
        "from cuzk_supervisor import nothing_here\n"
    )
    assert set(_targets("cuzk_supervisor.probe", source)) == {
        "cuzk_supervisor.core.health",
        "cuzk_supervisor.core.backoff",
        "cuzk_supervisor.core.jitter",
        "cuzk_supervisor",
    }
