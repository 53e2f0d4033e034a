"""constraints/tested.txt, the versions the README's install commands take (issue 39): it must pin every
package rpevit asks for, exactly once, at a version its own requirements allow, or a fresh install would
silently take a release CI never ran."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from importlib.metadata import PackageNotFoundError, distribution

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


def installed_closure() -> dict[str, str]:
    """Every distribution a fresh ``pip install -e ".[dev]"`` installs, read from this environment's metadata:
    rpevit's requirements, then theirs (extras and markers evaluated here), transitively. A requirement not
    installed here is left out with its own (pip would have installed it; this environment was not made so)."""
    out: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = requirements()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            continue
        out[key[0]] = dist.version
        environments = [{"extra": ""}] + [{"extra": extra} for extra in req.extras]
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate(env) for env in environments):
                todo.append(sub)
    return out


def test_every_package_the_install_pulls_in_is_pinned():
    """Not only the direct requirements: a dependency's dependency (setuptools, which torch asks for at >=77.0.3,
    so pip upgrades the venv's bundled one to the newest release) takes any new release unless it is pinned too.
    `pip freeze` leaves setuptools out; .ci/refresh-constraints writes `pip freeze --all` less pip itself."""
    closure = installed_closure()
    if "torch" not in closure:
        pytest.skip("rpevit's requirements are not installed in this environment")
    unpinned = sorted(set(closure) - set(pins()))
    assert not unpinned, (f"installed by `pip install -e \".[dev]\"` but not pinned in constraints/tested.txt: "
                          f"{', '.join(f'{n}=={closure[n]}' for n in unpinned)}")


def test_the_refresh_writes_setuptools_too():
    script = (ROOT / ".ci" / "refresh-constraints").read_text()
    freeze = [line for line in script.splitlines() if "pip freeze" in line]
    assert freeze and all("--all" in line for line in freeze), freeze
