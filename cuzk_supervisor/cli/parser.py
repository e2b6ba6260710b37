"""The command line's argparse parts: one parser class for every command, one help formatter.

``CommandParser`` refuses abbreviations (``--max-w`` is not ``--max-workers``), and a wrong flag
is two lines on stderr, exit 2: the error (with the nearest flag when one is close) and the
command's one-line usage; ``--help`` has the whole list. Unknown arguments are reported by the
subcommand they were given to, not by the top-level parser.

``HelpFormatter``: a one-line usage (``[options]``), descriptions re-wrapped paragraph by
paragraph (indented lines kept as written), no reST markup, no word cut at a hyphen.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from cuzk_supervisor import exitcodes
from cuzk_supervisor.settings import plain

MAX_WIDTH = 100


class HelpFormatter(argparse.HelpFormatter):
    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 32,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = min(MAX_WIDTH, shutil.get_terminal_size().columns - 2)
        super().__init__(prog, indent_increment, max_help_position, max(width, 40))

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = textwrap.dedent(plain(text)).strip().split("\n\n")
        out = []
        for paragraph in paragraphs:
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):  # a list or an example: as written
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False,
                                         break_long_words=False))  # fmt: skip
        return "\n\n".join(out)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """argparse's wrapping, but never cut at a hyphen (docs/sim-manager.md)."""
        flat = " ".join(plain(text).split())
        return textwrap.wrap(flat, width, break_on_hyphens=False, break_long_words=False)

    def _format_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None,
    ) -> str:
        if usage is None:
            usage = short_usage(list(actions))
        return super()._format_usage(usage, actions, groups, prefix)


def short_usage(actions: Sequence[argparse.Action]) -> str:
    """``%(prog)s [options]`` and what must be given: required flags, then positionals."""
    parts = ["%(prog)s"]
    if any(a.option_strings and a.help is not argparse.SUPPRESS for a in actions):
        parts.append("[options]")
    for action in actions:
        if action.option_strings and action.required:
            value = action.metavar or action.dest.upper()
            parts.append(f"{action.option_strings[0]} {value}")
    for action in actions:
        if not action.option_strings and action.help is not argparse.SUPPRESS:
            name = action.metavar or action.dest
            parts.append(f"{name} ..." if action.nargs == argparse.PARSER else str(name))
    return " ".join(parts)


class CommandParser(argparse.ArgumentParser):
    """Subparsers inherit it (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        given = kwargs.get("formatter_class", argparse.HelpFormatter)
        if given in (argparse.HelpFormatter, argparse.RawDescriptionHelpFormatter):
            kwargs["formatter_class"] = HelpFormatter  # keeps paragraphs, as RawDescription
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        usage = self.format_usage().strip()
        sys.stderr.write(f"{self.prog}: error: {message}\n{usage}  (see {self.prog} --help)\n")
        sys.exit(exitcodes.USAGE)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self.chosen_subparser(parsed) or self
            target.error(unrecognized(target, extras))
        return parsed

    def chosen_subparser(self, parsed: argparse.Namespace) -> CommandParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, CommandParser):
                    return chosen.chosen_subparser(parsed) or chosen
        return None


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's own words, and the nearest flag of ``parser`` to the first unknown one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    for extra in extras:
        if extra.startswith("--"):
            near = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.75)
            if near:
                return f"{message} (did you mean {near[0]}?)"
            break
    return message
