"""Every structlog event has a constant dotted name (issue 16.5).

The package is read with ``ast``: each call of a logger method (``log.info(...)``,
``self._log.warning(...)``, ``structlog.get_logger().error(...)``, ``getattr(log, level)(...)``)
must name its event with a string literal like ``gpu.watch_disabled``, or with a module constant
holding one (``proveprogress.EVENT_SUMMARY``). The detail goes into fields, never into the name:
a name built with an f-string, ``%`` or ``format``, taken from a variable, or written as a sentence
cannot be searched for, counted or matched by the terminal view.

Two explicit exceptions, each checked in its own way:

- ``FORWARDERS``: helpers that log an event named by their caller (a retry hook, a ticker). Inside
  them the name may be their parameter; every call of them must pass a checked name.
- ``IMITATION``: the simulator's modules log through ``sim.daemon.logfmt.DaemonLog`` (``target,
  message``), imitating the real daemon's lines on purpose. A module there that imports structlog
  is checked like any other; in the others every logger call must have DaemonLog's shape.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cuzk_supervisor

PACKAGE = Path(cuzk_supervisor.__file__).parent
NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "msg"})
# A logger: log, _log, self._log, self._worker_log, logger; or structlog.get_logger(...)...
LOGGER = re.compile(r"(^|[._])log(ger)?$")

FORWARDERS: dict[str, str] = {
    "log_retry": "event",  # adapters/proving/policy.py: tenacity's before_sleep hook
    "Ticker": "self.event",  # cli/commands/proveprogress.py: prove's progress events
}
"""A function or class whose logger calls take the event name from its caller: the name of the
expression they log with."""

IMITATION = "sim/"
"""The package whose loggers are the simulated daemon's ``DaemonLog`` (its own line format),
unless a module there imports structlog."""


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


MODULES = _modules()


def _imports_structlog(tree: ast.Module) -> bool:
    return any(
        "structlog" in (alias.name, getattr(node, "module", None) or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    )


def _imitates(where: str, tree: ast.Module) -> bool:
    return where.startswith(IMITATION) and not _imports_structlog(tree)


def _constants() -> dict[str, set[str]]:
    """Module-level ``UPPER_CASE = "text"`` assignments of the whole package, by name."""
    found: dict[str, set[str]] = {}
    for _, tree in MODULES:
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = [node.target.id] if isinstance(node.target, ast.Name) else []
            else:
                continue
            if isinstance(node.value.value, str):
                for target in targets:
                    if target.isupper():
                        found.setdefault(target, set()).add(node.value.value)
    return found


CONSTANTS = _constants()


def _is_event_name(node: ast.expr) -> bool:
    """A string literal that is a dotted name, or a constant (``X`` or ``module.X``) holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(NAME.match(node.value))
    ident = node.id if isinstance(node, ast.Name) else (
        node.attr if isinstance(node, ast.Attribute) else None
    )  # fmt: skip
    values = CONSTANTS.get(ident or "", set())
    return len(values) == 1 and all(NAME.match(v) for v in values)


def _logger_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr":
        return bool(func.args) and bool(LOGGER.search(ast.unparse(func.args[0])))
    if not isinstance(func, ast.Attribute) or func.attr not in METHODS:
        return False
    receiver = ast.unparse(func.value)
    return bool(LOGGER.search(receiver)) or "get_logger(" in receiver or ".bind(" in receiver


def _enclosing_forwarder(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node inside a forwarder (function or class) mapped to the forwarder's name."""
    inside: dict[ast.AST, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name in FORWARDERS
        ):
            for child in ast.walk(node):
                inside[child] = node.name
    return inside


def bad_event_names() -> list[str]:
    bad: list[str] = []
    for where, tree in MODULES:
        if _imitates(where, tree):
            continue
        inside = _enclosing_forwarder(tree)
        for node in ast.walk(tree):
            if not _logger_call(node):
                continue
            assert isinstance(node, ast.Call)
            first = node.args[0] if node.args else None
            if first is not None and _is_event_name(first):
                continue
            forwarder = inside.get(node)
            if first is not None and forwarder and ast.unparse(first) == FORWARDERS[forwarder]:
                continue
            shown = ast.unparse(first) if first is not None else "no event"
            bad.append(f"{where}:{node.lineno}: {shown}")
    return bad


def bad_forwarded_names() -> list[str]:
    bad: list[str] = []
    for where, tree in MODULES:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else None
            )  # fmt: skip
            if called not in FORWARDERS:
                continue
            first = node.args[0] if node.args else None
            if first is None or not _is_event_name(first):
                shown = ast.unparse(first) if first is not None else "no event"
                bad.append(f"{where}:{node.lineno}: {called}({shown})")
    return bad


def test_every_event_is_a_constant_dotted_name():
    assert bad_event_names() == []


def test_every_forwarded_event_is_a_constant_dotted_name():
    assert bad_forwarded_names() == []


def test_the_simulators_imitation_has_the_daemon_logs_shape():
    """Without structlog, a logger call in sim/ is DaemonLog's: a target and a message."""
    calls = [
        (where, node)
        for where, tree in MODULES
        if _imitates(where, tree)
        for node in ast.walk(tree)
        if _logger_call(node)
    ]
    assert calls  # the exception is still needed
    odd = [
        f"{where}:{node.lineno}"
        for where, node in calls
        if isinstance(node, ast.Call) and len(node.args) < 2
    ]
    assert odd == []


def test_the_forwarders_exist():
    defined = {
        node.name
        for _, tree in MODULES
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    assert set(FORWARDERS) <= defined


def test_the_check_finds_what_it_is_for():
    """The scanner itself: a sentence, an f-string, a variable and a bare call are caught."""
    source = """
log.warning("gpu watching disabled: NVML unavailable", error=e)
log.info(f"{name}.replaced")
self._log.info(text, stream=s)
structlog.get_logger().error("status")
getattr(log, level)("daemon exited")
log.info("daemon.ready", pid=1)
outcome.exception()
"""
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if _logger_call(n)]
    assert isinstance(calls[0], ast.Call)
    flagged = sorted(
        n.lineno for n in calls if isinstance(n, ast.Call) and not _is_event_name(n.args[0])
    )
    assert flagged == [2, 3, 4, 5, 6]
    assert len(calls) == 6  # outcome.exception() is not a logger
