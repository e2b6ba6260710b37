"""The image's inputs agree with each other; no Docker here (``make image-test`` runs one).

constraints.txt is what the image installs: it must pin every runtime dependency and build
requirement of pyproject.toml, each at a version the requirement allows, and say (by a hash of
those inputs) that it was made from the current pyproject.toml by ``make constraints``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"
IMAGE_TEST = ROOT / "deploy" / "image-test.sh"


def _generator():
    spec = importlib.util.spec_from_file_location("constraints_gen", ROOT / "deploy/constraints.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(text: str) -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        assert match, f"not an exact pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(match[2])
    return found


@pytest.fixture(scope="module")
def pinned() -> dict[str, Version]:
    return pins(CONSTRAINTS.read_text())


def requirements() -> list[Requirement]:
    doc = tomllib.loads(PYPROJECT.read_text())
    return [
        Requirement(r) for r in (*doc["project"]["dependencies"], *doc["build-system"]["requires"])
    ]


@pytest.mark.parametrize("req", requirements(), ids=str)
def test_every_requirement_is_pinned_at_a_version_it_allows(pinned, req):
    name = canonicalize_name(req.name)
    assert name in pinned, f"{req} is not in constraints.txt: run `make constraints`"
    assert req.specifier.contains(pinned[name], prereleases=True), (
        f"constraints.txt pins {name}=={pinned[name]}, outside {req}: run `make constraints`"
    )


def test_made_from_the_current_pyproject_by_the_documented_command():
    text = CONSTRAINTS.read_text()
    gen = _generator()
    assert f"#   {gen.COMMAND}\n" in text
    recorded = re.search(r"^# pyproject-inputs-sha256: ([0-9a-f]{64})$", text, re.MULTILINE)
    assert recorded, "constraints.txt lacks its inputs hash: run `make constraints`"
    assert recorded[1] == gen.inputs_hash(PYPROJECT), (
        "pyproject.toml's dependencies changed since constraints.txt was made: "
        "run `make constraints`"
    )
    make = subprocess.run(
        ["make", "-n", "constraints"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "deploy/constraints.py" in make.stdout


def test_the_hash_sees_a_changed_dependency(tmp_path):
    gen = _generator()
    changed = tmp_path / "pyproject.toml"
    changed.write_text(PYPROJECT.read_text().replace('"psutil>=5.9.8"', '"psutil>=6"'))
    assert gen.inputs_hash(changed) != gen.inputs_hash(PYPROJECT)


def test_render_writes_what_the_check_reads():
    gen = _generator()
    text = gen.render([("psutil", "7.0.0"), ("setuptools", "80.0")], "ab" * 32)
    assert pins(text) == {"psutil": Version("7.0.0"), "setuptools": Version("80.0")}
    assert f"# pyproject-inputs-sha256: {'ab' * 32}\n" in text


def test_the_image_build_uses_the_constraints():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY constraints.txt" in dockerfile
    assert "PIP_CONSTRAINT=/src/constraints.txt" in dockerfile
    script = IMAGE_TEST.read_text()
    assert "-r constraints.txt" in script, "the offline wheelhouse is the constraints' wheels"


def test_image_test_is_wired_into_make_and_ci():
    make = subprocess.run(
        ["make", "-n", "image-test"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "deploy/image-test.sh" in make.stdout
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line.strip() for line in ci if line.strip() and not line.startswith("#")]
    assert steps.index("make test") < steps.index("make image-test"), "test failures first"
