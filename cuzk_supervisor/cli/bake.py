"""``python -m cuzk_supervisor.cli.bake``: write the settings an image carries (build time).

The platform that starts our image passes no manager URL (manager-api.md, "Deploy"), so the
operator fixes it, and whatever else is the same across the fleet, when building the image:

    docker build --build-arg CUZK_MANAGER_URL=https://manager.example:8080 \\
        --build-arg 'CUZK_SETTINGS=bench_budget_s = 1800' ...

The Dockerfile runs this with those build arguments; it writes them as one TOML file at
``settings.IMAGE_SETTINGS_FILE``, which ``settings.load`` reads below every other source. Every
value is checked as the supervisor checks it at its start, so a bad one fails the build (one line,
exit 2) instead of every machine of the fleet. A secret setting is refused: a build argument is
in ``docker history`` and the file in a layer, and the token must be in neither.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.adapters import files
from cuzk_supervisor.errors import UsageError

FILE_MODE = 0o644  # read by the supervisor whatever user it runs as; holds no secret
FOLDER_MODE = 0o755
HEADER = (
    "# Settings baked into this image at build time (cuzk_supervisor.cli.bake).\n"
    "# Read below every other source: flag > environment > config file > this file > default.\n"
)


def render(manager_url: str, extra_toml: str) -> str:
    """The URL first (a TOML basic string: JSON's escapes are TOML's), so that it stays a
    top-level key whatever tables ``extra_toml`` opens."""
    lines = [HEADER]
    if manager_url:
        lines.append(f"manager_url = {json.dumps(manager_url)}\n")
    if extra_toml.strip():
        lines.append(extra_toml.rstrip("\n") + "\n")
    return "".join(lines)


def check(text: str, out: Path) -> settings.Settings:
    """``text`` loaded as the image file ``out`` alone would be at run time, else UsageError."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "settings.toml"
        path.write_text(text, encoding="utf-8")
        try:
            return settings.load({}, {settings.IMAGE_SETTINGS_FILE_ENV: str(path)}).settings
        except UsageError as exc:  # named as the file it will be, not the scratch copy
            raise UsageError(str(exc).replace(str(path), str(out))) from None


def bake(out: Path, manager_url: str, extra_toml: str) -> str:
    text = render(manager_url, extra_toml)
    check(text, out)
    files.make_folder(out.parent, FOLDER_MODE)
    files.atomic_write(out, text.encode("utf-8"), FILE_MODE)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cuzk_supervisor.cli.bake",
        description="write the settings baked into an image (run by the Dockerfile)",
    )
    p.add_argument(
        "--out", type=Path, default=Path(settings.IMAGE_SETTINGS_FILE), help="file to write"
    )
    p.add_argument("--manager-url", default="", help="the fleet manager's base URL")
    p.add_argument("--settings", default="", help="more settings, as TOML text")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = bake(args.out, args.manager_url, args.settings)
    except UsageError as exc:
        sys.stderr.write(f"cuzk-supervisor bake: {exc}\n")
        return exitcodes.USAGE
    except OSError as exc:
        sys.stderr.write(f"cuzk-supervisor bake: cannot write {args.out}: {files.describe(exc)}\n")
        return exitcodes.FAILURE
    keys = sum(1 for line in text.splitlines() if "=" in line and not line.startswith("#"))
    sys.stdout.write(f"cuzk-supervisor bake: {keys} setting(s) in {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
