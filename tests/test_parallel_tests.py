"""The suite in two processes (README command 2: `pytest -n 2 --dist loadgroup`): the modules
tests/conftest.py lets run beside others start no Ray, sweep or cluster, and the README and CI run the
same command. A module that starts Ray beside another Ray-starting module could collide on Ray's ports,
its session folder or the process counts some tests make."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import BESIDE_OTHERS

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
COMMAND = "python -m pytest -q -n 2 --dist loadgroup"
# what starts a Ray (embedded or a cluster), a real sweep, or sweep.py as a process
STARTS_RAY = re.compile(r"ray\.init\(|\bray\b.{0,20}\"start\"|\brun_sweep\(|\btune\.Tuner\(|[\"']sweep\.py[\"'],")


def test_every_listed_module_exists_and_starts_no_ray():
    modules = {path.stem for path in TESTS.glob("test_*.py")}
    assert BESIDE_OTHERS <= modules, f"listed but not a test module: {sorted(BESIDE_OTHERS - modules)}"
    for name in sorted(BESIDE_OTHERS):
        source = (TESTS / f"{name}.py").read_text()
        found = STARTS_RAY.search(source)
        assert found is None, f"tests/{name}.py runs beside other tests but starts Ray or a sweep: {found.group(0)!r}"


@pytest.mark.parametrize("line", ['    assert run_sweep(space, options) == 0', 'ray.init(address="auto")',
                                  'subprocess.run([ray, "start", "--head"])',
                                  'subprocess.run([sys.executable, "sweep.py", "--space", s])'])
def test_the_check_sees_each_way_a_test_starts_ray(line):
    assert STARTS_RAY.search(line), line


def test_a_module_that_starts_ray_is_serial_and_is_not_listed():
    assert "test_sweep_ray" not in BESIDE_OTHERS and "test_sweep_multinode" not in BESIDE_OTHERS
    assert STARTS_RAY.search((TESTS / "test_sweep_multinode.py").read_text())


def test_this_run_puts_every_unlisted_module_in_the_serial_group(request):
    for item in request.session.items:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert groups == ([] if item.path.stem in BESIDE_OTHERS else ["serial"]), (item.nodeid, groups)


def test_the_readme_and_ci_run_the_same_parallel_command():
    readme = (ROOT / "README.md").read_text()
    assert f"&& {COMMAND}\n" in readme
    assert f"\n{COMMAND}\n" in (ROOT / ".ci" / "run").read_text()
