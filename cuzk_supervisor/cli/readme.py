"""Regenerate the generated parts of README.md (``make readme``); a test checks they are current.

Blocks live between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from cuzk_supervisor import exitcodes, settings

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS: dict[str, Callable[[], str]] = {
    "settings": settings.markdown_table,
    "exitcodes": exitcodes.markdown_table,
}


def render(text: str) -> str:
    for name, make in BLOCKS.items():
        pattern = re.compile(
            rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", flags=re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"README has no {name} block")
        body = make()

        def replace(match: re.Match[str], body: str = body) -> str:
            return match.group(1) + body + "\n" + match.group(2)

        text = pattern.sub(replace, text)
    return text


def main() -> int:
    current = README.read_text()
    updated = render(current)
    if updated != current:
        README.write_text(updated)
        print(f"updated {README.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
