"""The wheels a GPU lease carries (benchmarks/lease/wheels.txt) and the device image's packages
(benchmarks/lease/device_image.txt) cover every import of sweep.py, Ray Tune, the fused compiled step,
the FLOP count and tests/test_gpu.py.

Issue 40: `import ray.tune` failed on the device image (Ray 2.60's Tune imports pydantic, which the
image lacks and the lease did not carry), so sweep.py died at start and tests/test_gpu.py did not
collect, and nothing here could see it. This test imports those modules in a subprocess whose import
system refuses every module whose distribution is neither on the image nor carried (the standard
library and the repository's own packages aside): what the device would refuse. The full rehearsal,
with the image's versions, is benchmarks/gpu_rehearsal.sh.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEASE = ROOT / "benchmarks" / "lease"

# Run in a fresh interpreter: a finder first on sys.meta_path that refuses what the device lacks.
GUARD = r'''
import importlib.abc, importlib.machinery, importlib.metadata, os, re, sys
allowed = set(sys.argv[1].split(","))
owners = importlib.metadata.packages_distributions()
local = {"rpevit", "tests", "sweep", "benchmarks", "conftest"}

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

class DeviceImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names or top in local:
            return None
        dists = {norm(d) for d in owners.get(top, [])}
        if not dists:  # vendored (ray's thirdparty_files on sys.path): the package whose folder holds it
            spec = importlib.machinery.PathFinder.find_spec(top)
            origin = os.path.realpath(spec.origin or "") if spec else ""
            marker = os.sep + "site-packages" + os.sep
            if spec is None or marker not in origin:  # absent here too, or the interpreter's own library
                return None
            if marker in origin:
                holder = origin.split(marker, 1)[1].split(os.sep)[0]
                dists = {norm(d) for d in owners.get(holder, [])}
        if dists & allowed:
            return None
        raise ModuleNotFoundError(f"REFUSED {name} (distribution {sorted(dists) or 'unknown'}): neither on "
                                  f"the device image nor in the lease's wheels", name=name)

sys.meta_path.insert(0, DeviceImage())
import ray
from ray import tune
import sweep
import rpevit.sweep.runner, rpevit.sweep.tune_run, rpevit.sweep.trainable, rpevit.sweep.writer
from rpevit import registry
registry.load_all()
import rpevit.flops, rpevit.tasks.train_group
import tests.test_gpu
print("IMPORTS OK")
'''


def names(path: Path) -> set[str]:
    """Normalised distribution names of a list file (name or name==version per line, # comments)."""
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(re.sub(r"[-_.]+", "-", line.split("==")[0]).lower())
    return out


def guarded_imports(allowed: set[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GUARD, ",".join(sorted(allowed))], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_image_and_carried_wheels_cover_every_import_of_the_lease():
    result = guarded_imports(names(LEASE / "device_image.txt") | names(LEASE / "wheels.txt") | {"rpevit"})
    assert result.returncode == 0 and "IMPORTS OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_the_check_refuses_what_the_lease_does_not_carry():
    """The wheels the lease carried before issue 40 (no pydantic): `import ray.tune` is refused, as it
    was on the device; so the check above can fail."""
    before = names(LEASE / "wheels.txt") - {"pydantic", "pydantic-core", "annotated-types", "typing-inspection"}
    result = guarded_imports(names(LEASE / "device_image.txt") | before | {"rpevit"})
    assert result.returncode != 0 and "REFUSED pydantic" in result.stderr, result.stderr[-3000:]


def test_the_lists_are_consistent():
    image, carried = names(LEASE / "device_image.txt"), names(LEASE / "wheels.txt")
    assert {"torch", "numpy", "pandas", "pyarrow", "pytest"} <= image
    assert not image & carried, image & carried  # carry only what the image lacks (two versions stop pip)
    assert "pydantic" in carried and "ray" in carried
