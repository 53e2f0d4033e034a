#!/usr/bin/env bash
# The GPU lease rehearsed on this CPU, in one command, before a GPU is lent (issue 40):
#
#   benchmarks/gpu_rehearsal.sh [DATA_DIR]        (DATA_DIR holds mnist.npz; default $RPEVIT_DATA)
#
# 1. a virtual environment like the device image (.venv-rehearsal, git-ignored): Python 3.12, torch 2.11.0
#    (PyPI's x86_64 wheel, a CUDA build that runs on the CPU, with its CUDA libraries: ~5 GB once, cached
#    by pip) and the image's other packages that the lease imports, at the versions
#    benchmarks/lease/device_image.txt gives (constraints/tested.txt's where the image's are not read yet);
#    nothing of the lease's wheels: those come as the lease brings them;
# 2. the lease's own pack (benchmarks/gpu_lease.sh prepare: .lease/site.tar.xz and mnist.npz), unpacked
#    and put on PYTHONPATH exactly as the lease's first call does;
# 3. the lease's three calls with LEASE_REHEARSAL=1 (benchmarks/gpu_lease.sh first, study, finish): every
#    import sweep.py needs; tests/test_gpu.py collected (its tests skip without CUDA); a few fused +
#    compiled + bf16 steps of every all12.yaml cell at 49 and 64 tokens against their eager solo steps
#    (tests/all12_cells.py: aot_eager for all 24, Inductor's CPU backend for the four riskiest: softmax
#    with luo_rpe and with circulant_string, at both token counts); the throughput benchmark, CPU-sized
#    (aot_eager: it checks the script, not the CPU's speed);
#    the deadline planner with the lease's deadline and estimate (it must admit work); a real sweep.py
#    run of one fused group through Ray, with its rows and curves.
# Exits non-zero on the first step that fails. Output: $REHEARSAL_OUT (default /tmp/rehearsal/out).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
data=${1:-${RPEVIT_DATA:-}}
VENV=${REHEARSAL_VENV:-.venv-rehearsal}
WORK=${REHEARSAL_DIR:-/tmp/rehearsal}
t_start=$(date +%s)
step() { echo; echo "== rehearsal [$(( $(date +%s) - t_start )) s] $*"; }

python312=${PYTHON312:-}
for candidate in $(command -v python3.12) ~/.pyenv/versions/3.12*/bin/python3 /usr/bin/python3.12; do
  [[ -z $python312 ]] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2> /dev/null \
      && python312=$candidate
done
[[ -n "$python312" ]] || { echo "error: no Python 3.12 (the image's version); set PYTHON312" >&2; exit 2; }

step "1. the image's environment in $VENV"
if [[ ! -f $VENV/.image-ok ]]; then
  rm -rf "$VENV"
  "$python312" -m venv "$VENV"
  pins=$(mktemp)
  # the image's versions where known, else the tested ones, in one constraints file (the image's win;
  # torch's own CUDA libraries and compiler follow torch 2.11's requirements, not the tested torch's)
  "$python312" - "$pins" <<'EOF'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
def pins(path):
    return {norm(l.split("==")[0]): l.strip() for l in open(path) if "==" in l and not l.startswith("#")}
image, tested = pins("benchmarks/lease/device_image.txt"), pins("constraints/tested.txt")
image.pop("python", None)
merged = {**{k: v for k, v in tested.items() if not re.match(r"(nvidia-|cuda-|triton$|torch)", k)}, **image}
open(sys.argv[1], "w").write("\n".join(merged.values()) + "\n")
EOF
  # what the lease's steps import from the image (rpevit's dependencies but Ray and fvcore, which the
  # lease carries; pytest and pytest-xdist; what Ray and fvcore need that the image has)
  "$VENV/bin/pip" install -q -c "$pins" torch==2.11.0 numpy timm einops pandas pyarrow pyyaml matplotlib \
      scikit-learn scipy tensorboard pytest pytest-xdist click filelock msgpack packaging protobuf requests \
      portalocker tabulate tqdm pillow
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, re
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.strip().split("==")[0]) for l in open("benchmarks/lease/device_image.txt") if l.strip() and l[0] != "#"}
extra = sorted(norm(d.metadata["Name"]) for d in md.distributions() if norm(d.metadata["Name"]) not in image | {"pip"})
print("installed but not on the image's list (the list may be incomplete; check image.txt of a lease):",
      ", ".join(extra) or "none")
EOF
  rm -f "$pins"
  touch "$VENV/.image-ok"
fi
"$VENV/bin/python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'

step "2. the lease's pack (.lease)"
if [[ ! -f .lease/site.tar.xz ]]; then
  [[ -n "$data" && -f "$data/mnist.npz" ]] || { echo "error: no mnist.npz in '${data}': pass DATA_DIR" >&2; exit 2; }
  bash benchmarks/gpu_lease.sh prepare "$data"
fi
ls -la .lease
# what the carried wheels require (Ray with its `tune` extra) that the image holds: into the venv too, at
# the image's versions, as the image has them (the lease relies on them there)
probe=$(mktemp -d)
xz -dc .lease/site.tar.xz | tar xf - -C "$probe" --wildcards '*.dist-info/METADATA'
needed=$("$VENV/bin/python" - "$probe" <<'EOF'
import pathlib, re, sys
from packaging.requirements import Requirement
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.strip().split("==")[0]) for l in open("benchmarks/lease/device_image.txt") if l.strip() and l[0] != "#"}
carried, wanted = set(), set()
for meta in pathlib.Path(sys.argv[1]).glob("*.dist-info/METADATA"):
    lines = meta.read_text(errors="replace").splitlines()
    carried.add(norm(next(l for l in lines if l.startswith("Name:")).split(":", 1)[1].strip()))
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1])
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", "tune")):
                wanted.add(norm(req.name))
print(" ".join(sorted((wanted - carried) & image)))
EOF
)
rm -rf "$probe"
echo "the image's packages the carried wheels require: $needed"
"$VENV/bin/pip" install -q -c <(grep '==' benchmarks/lease/device_image.txt | grep -v '^python==') $needed

export LEASE_PYTHON=$PWD/$VENV/bin/python LEASE_DIR=$WORK LEASE_REHEARSAL=1 OUT=${REHEARSAL_OUT:-$WORK/out}
rm -rf "$WORK"; mkdir -p "$OUT"
step "3a. the lease's first call (imports, gpu tests collected, all12 cells)"
REHEARSAL_BACKEND=aot_eager bash benchmarks/gpu_lease.sh first
grep -q "imports ok" "$OUT/imports.log" || { echo "error: the lease's imports failed: $OUT/imports.log" >&2; exit 1; }
grep -qE "[0-9]+ skipped" "$OUT/pytest_gpu.log" && ! grep -qiE "error" "$OUT/pytest_gpu.log" \
    || { echo "error: tests/test_gpu.py did not collect cleanly: $OUT/pytest_gpu.log" >&2; exit 1; }
grep -q "24 of 24 cells ok" "$OUT/cells.log" || { echo "error: all12 cells failed (aot_eager): $OUT/cells.log" >&2; exit 1; }
step "3b. the riskiest cells under Inductor's CPU backend"
PYTHONPATH=$WORK/site:$PWD "$LEASE_PYTHON" -m tests.all12_cells --device cpu --backend inductor --only softmax+luo_rpe \
    --json "$OUT/cells_inductor_luo.json" | tee "$OUT/cells_inductor.log"
PYTHONPATH=$WORK/site:$PWD "$LEASE_PYTHON" -m tests.all12_cells --device cpu --backend inductor \
    --only softmax+circulant --json "$OUT/cells_inductor_circulant.json" | tee -a "$OUT/cells_inductor.log"
step "3c. the lease's study call (benchmark; plan with the lease's deadline and estimate; a CPU-sized sweep)"
LEASE_WAIT_S=1500 bash benchmarks/gpu_lease.sh study
grep -q '"mode": "solo eager"' "$OUT/throughput.json" || { echo "error: no benchmark rows" >&2; exit 1; }
grep -q "fused group(s) of 3 fit" "$OUT/lease_plan.txt" || { echo "error: no plan: $OUT/lease_plan.txt" >&2; exit 1; }
step "3d. the lease's finish call"
bash benchmarks/gpu_lease.sh finish
[[ -f $OUT/trials.parquet ]] || { echo "error: the sweep brought back no rows: $OUT/sweep.log" >&2; exit 1; }
step "done in $(( $(date +%s) - t_start )) s; files in $OUT"
