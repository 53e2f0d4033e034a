"""constraints/tested.txt, the versions the README's install commands take (issue 39): it must pin every
package rpevit asks for, exactly once, at a version its own requirements allow, or a fresh install would
silently take a release CI never ran."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def pins() -> dict[str, Version]:
    out: dict[str, Version] = {}
    for line in (ROOT / "constraints" / "tested.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"constraints/tested.txt: {line!r} is not an exact pin 'name==version'"
        name = canonicalize_name(match.group(1))
        assert name not in out, f"constraints/tested.txt pins {name} twice"
        out[name] = Version(match.group(2))
    return out


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_every_requirement_is_pinned_at_a_version_it_allows():
    pinned = pins()
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is required by pyproject.toml but not pinned in constraints/tested.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), \
            f"constraints/tested.txt pins {name}=={pinned[name]}, outside pyproject's {req}"


def test_the_readme_and_ci_install_from_the_constraints():
    readme = (ROOT / "README.md").read_text()
    installs = [line for line in readme.splitlines() if "pip install -e" in line and line.startswith("python3 -m venv")]
    assert installs and all("-c constraints/tested.txt" in line for line in installs), installs
    assert "-c constraints/tested.txt" in (ROOT / ".ci" / "run").read_text()
