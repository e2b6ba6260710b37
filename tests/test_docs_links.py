"""What a person with only the clone reads leads somewhere: every relative link of README.md and
docs/ resolves to a file of the repository (and its ``#anchor`` to a heading there), every
section of README.md or docs/ that the code cites exists, and nothing points outside the clone.
The generated tables are checked against the code in tests/test_readme.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [
    path
    for folder in ("cuzk_supervisor", "bench", "tests", "deploy", ".ci")
    for path in sorted((ROOT / folder).rglob("*"))
    if path.is_file() and path.suffix in (".py", ".sh", ".yaml", "") and "proto" not in path.parts
]
CODE += [ROOT / "Dockerfile", ROOT / "Makefile"]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)
# A cited section: a page, then its heading in quotes: docs/benchmark.md 'What bounds the rate',
# docs/daemon.md, "Measured figures", README "Exit codes".
CITATION = re.compile(r"""(README(?:\.md)?|docs/[\w.-]+\.md),? (["'])([^"'\n]+?)\2""")
PAGE_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")
MAPPING = "The sources the code cites"  # docs/architecture.md: old reference names -> pages


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: links kept as their text, markup and punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)]


def test_anchor_is_githubs() -> None:
    assert anchor("Health, metrics and logs") == "health-metrics-and-logs"
    assert anchor("The fleet manager's API: what it does") == "the-fleet-managers-api-what-it-does"
    linked = "Transport behaviour ([daemon.md](daemon.md#x))"
    assert anchor(linked) == "transport-behaviour-daemonmd"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: … leave the clone on purpose
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and fragment not in {anchor(h) for h in headings(resolved)}:
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_clone(page: Path) -> None:
    """The old reference's names appear only where docs/architecture.md maps them to pages."""
    text = page.read_text()
    assert "../shared" not in text
    text = text.split(f"## {MAPPING}")[0]
    assert "reference/cuzk.md" not in text
    assert "reference/manager-api.md" not in text


def _citations() -> list[tuple[str, str, str]]:
    found = []
    for path in CODE:
        text = path.read_text(errors="replace").replace('\\"', '"')
        where = str(path.relative_to(ROOT))
        found += [(where, m.group(1), m.group(3)) for m in CITATION.finditer(text)]
    return found


def test_the_code_cites_sections_at_all() -> None:
    """The scan finds the citations it is meant to check (a regex gone wrong would pass all)."""
    cited = {(page, section) for _, page, section in _citations()}
    assert ("docs/benchmark.md", "What bounds the rate") in cited
    assert ("docs/daemon.md", "Measured figures") in cited


def test_every_section_the_code_cites_exists() -> None:
    missing = []
    for where, page, section in _citations():
        path = ROOT / ("README.md" if page.startswith("README") else page)
        if not path.exists():
            missing.append(f"{where}: {page} does not exist")
        elif section not in headings(path):
            missing.append(f"{where}: {page} has no section {section!r}")
    assert missing == []


def test_every_docs_page_the_code_and_the_pages_name_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {name}"
            for path in [*CODE, *PAGES]
            for name in PAGE_PATH.findall(path.read_text(errors="replace"))
            if not (ROOT / name).exists()
        }
    )
    assert missing == []


def test_the_program_cites_nothing_outside_the_clone() -> None:
    package = ROOT / "cuzk_supervisor"
    outside = [
        str(path.relative_to(ROOT))
        for path in package.rglob("*.py")
        if "../shared" in path.read_text() or "shared/reference" in path.read_text()
    ]
    assert outside == []
