"""Write ``constraints.txt``: the exact versions the image installs (``make constraints``).

The image build (Dockerfile) installs the project's dependencies, and the build backend that
makes its wheel, under ``PIP_CONSTRAINT=constraints.txt``, so two builds of one commit get the
same versions whatever was released in between. This script resolves ``pyproject.toml``'s
runtime dependencies and its ``[build-system] requires`` with pip (a dry run: nothing is
installed) against PyPI alone (``PIP_CONFIG_FILE=/dev/null``: a local mirror's pip.conf does not
take part), for the interpreter that runs it. Run it with a CPython of the base image's minor
version on Linux x86_64 (the default base is Python 3.11 on Debian bookworm; so is ``.venv``).

The header records a hash of the inputs; ``tests/test_image.py`` fails when ``pyproject.toml``'s
dependencies change and the file was not made again, or when a pin does not satisfy them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
OUTPUT = ROOT / "constraints.txt"
COMMAND = "make constraints"


def inputs(pyproject: Path = PYPROJECT) -> list[str]:
    """What the constraints are made from, in a fixed order: runtime deps, then build deps."""
    doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return [*doc["project"]["dependencies"], *doc["build-system"]["requires"]]


def inputs_hash(pyproject: Path = PYPROJECT) -> str:
    return hashlib.sha256("\n".join(inputs(pyproject)).encode()).hexdigest()


def resolve(requirements: list[str]) -> list[tuple[str, str]]:
    """(name, version) of everything pip would install for ``requirements``, sorted."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--no-cache-dir", "--index-url", "https://pypi.org/simple", "--report", "-",
         *requirements],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    report = json.loads(out.stdout)
    pins = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in report["install"]
    }
    return sorted(pins.items())


def render(pins: list[tuple[str, str]], digest: str) -> str:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [
        "# The versions the image installs (Dockerfile: PIP_CONSTRAINT). Generated, do not edit:",
        f"#   {COMMAND}",
        f"# resolved from pyproject.toml's dependencies and build-system requires, for CPython "
        f"{py} on {sys.platform}.",
        f"# pyproject-inputs-sha256: {digest}",
        *(f"{name}=={version}" for name, version in pins),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    requirements = inputs()
    OUTPUT.write_text(render(resolve(requirements), inputs_hash()), encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)} for {len(requirements)} requirements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
