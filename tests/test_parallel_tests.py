"""The suite in two processes (README command 2: `pytest -n 2 --dist loadgroup`): the modules
tests/conftest.py lets run beside others start no Ray, sweep or cluster, and the README and CI run the
same command. A module that starts Ray beside another Ray-starting module could collide on Ray's ports,
its session folder or the process counts some tests make."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import BESIDE_OTHERS, work_unit

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


def test_every_test_of_an_unlisted_module_is_in_the_one_serial_unit(request):
    for item in request.session.items:
        unit = work_unit(item.nodeid)
        assert unit == (item.nodeid if item.path.stem in BESIDE_OTHERS else "serial"), (item.nodeid, unit)
    assert work_unit("tests/test_sweep_ray.py::test_x[a-b]") == work_unit("tests/test_sweep_multinode.py::t") == "serial"
    assert work_unit("tests/test_config.py::test_x[a::b]") == "tests/test_config.py::test_x[a::b]"


def test_a_loadgroup_run_gets_the_serial_unit_scheduler(request, monkeypatch):
    """xdist 3.8's own loadgroup reads xdist_group markers through item._nodeid, which pytest 9 ignores:
    its groups did nothing (CI, 2026-11-28). The scheduler that --dist loadgroup gets here splits by
    work_unit instead."""
    xdist = pytest.importorskip("xdist.scheduler")
    from tests import conftest

    monkeypatch.setattr(request.config.option, "dist", "loadgroup", raising=False)  # absent under -p no:xdist
    monkeypatch.setattr(request.config.option, "tx", ["popen", "popen"], raising=False)  # what -n 2 becomes
    scheduler = conftest.pytest_xdist_make_scheduler(request.config, None)
    assert isinstance(scheduler, xdist.LoadScopeScheduling)
    assert scheduler._split_scope("tests/test_sweep_cli.py::t") == "serial"
    assert scheduler._split_scope("tests/test_config.py::t") == "tests/test_config.py::t"


def test_the_readme_and_ci_run_the_same_parallel_command():
    readme = (ROOT / "README.md").read_text()
    assert f"&& {COMMAND}\n" in readme
    assert f"\n{COMMAND}\n" in (ROOT / ".ci" / "run").read_text()
