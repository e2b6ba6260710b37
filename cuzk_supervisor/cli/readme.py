"""Regenerate the generated tables of the documentation (``make readme``); a test checks they
are current. Blocks live between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from cuzk_supervisor import exitcodes, settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
Blocks = Mapping[str, Callable[[], str]]
GENERATED: dict[Path, Blocks] = {
    README: {"exitcodes": exitcodes.markdown_table},
    CONFIGURATION: {"settings": settings.markdown_table},
}


def render(text: str, blocks: Blocks) -> str:
    for name, make in blocks.items():
        pattern = re.compile(
            rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", flags=re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"no {name} block")
        body = make()

        def replace(match: re.Match[str], body: str = body) -> str:
            return match.group(1) + body + "\n" + match.group(2)

        text = pattern.sub(replace, text)
    return text


def main() -> int:
    for path, blocks in GENERATED.items():
        current = path.read_text()
        updated = render(current, blocks)
        if updated != current:
            path.write_text(updated)
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
