#!/usr/bin/env bash
# The GPU lease rehearsed on this CPU, in one command, before a GPU is lent (issues 40 and 60):
#
#   REHEARSAL_BUDGET_S=810 benchmarks/gpu_rehearsal.sh [DATA_DIR]   the short lease's calls (a 15-minute lend)
#   benchmarks/gpu_rehearsal.sh [DATA_DIR]                          the long lease's, with every all12 cell
#   REHEARSAL_RUNG=1 benchmarks/gpu_rehearsal.sh [DATA_DIR]         the CIFAR-10 rung lease's calls (issue 60, 4)
#                                                   (DATA_DIR holds mnist.npz, and cifar10.npz for the rung
#                                                   lease; default $RPEVIT_DATA)
#
# 1. a virtual environment like the device image (.venv-rehearsal, git-ignored): Python 3.12, torch 2.11.0
#    (PyPI's x86_64 wheel, a CUDA build that runs on the CPU, with its CUDA libraries: ~5 GB once, cached
#    by pip) and the image's other packages that the lease imports, at the versions
#    benchmarks/lease/device_image.txt gives (the image's own `pip list` from a lease's image.txt;
#    constraints/tested.txt's for a package it does not list); nothing of the lease's wheels: those come
#    as the lease brings them;
# 2. the lease's own pack (benchmarks/gpu_lease.sh prepare: .lease/site.tar.xz and mnist.npz), unpacked
#    and put on PYTHONPATH exactly as the lease's first call does;
# 3. (REHEARSAL_RUNG=1: benchmarks/lease/rehearse_rung.sh instead, in this venv with the real .lease: the parts
#    prepared, each planned call replayed on one machine folder with the parts it carries, `receive` then
#    `rung 3`, a CPU-sized group of the rung on the rebuilt CIFAR-10; its header says what it does not rehearse)
#    the lease's calls with LEASE_REHEARSAL=1, each command as `gpu_lease.sh budget` prints it for the
#    lease, with every time of the plan times REHEARSAL_TIME_SCALE (default 3: this CPU is slower; the
#    times are caps, and the steps end when done):
#    short (REHEARSAL_BUDGET_S, under 1500): call 1 `first; bench`: every import sweep.py needs,
#    tests/test_gpu.py collected (pytest_gpu.collected) and run with pytest-timeout as on the device (its
#    tests skip without CUDA; the XML must hold every collected one), the benchmark in the short lease's
#    order (packed, then fused and the whole step in one graph; the tiny model under aot_eager: it checks
#    the script, not the CPU's speed), and summary.py on what came back; call 2 `main`: the deadline
#    planner with the lease's own deadline and the last lease's packed rate (it must admit whole
#    groups), then a CPU-sized sweep.py run of one fused group through Ray, its rows (a snapshot) and
#    curves; then `group` on a fresh machine (a new LEASE_DIR: it unpacks .lease itself), its rows
#    back (benchmarks/lease/rehearsal_checks.py);
#    long: `first`; a few fused + compiled + bf16 steps of every all12.yaml cell at 49 and 64 tokens
#    against their eager solo steps (tests/all12_cells.py: aot_eager for all 24, Inductor's CPU backend
#    for the four riskiest: softmax with luo_rpe and with circulant_string, at both token counts);
#    `study` (the benchmark, the planner with the lease's deadline, a CPU-sized sweep) and `finish`.
# Exits non-zero on the first step that fails. Output: $REHEARSAL_OUT (default out/ in a new folder of mktemp -d,
# named at the end; REHEARSAL_DIR: that folder instead, emptied first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
data=${1:-${RPEVIT_DATA:-}}
VENV=${REHEARSAL_VENV:-.venv-rehearsal}
WORK=${REHEARSAL_DIR:-}   # empty: a new folder (before step 3)
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
import os, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
def pins(path):
    return {norm(l.split("==")[0]): l.strip() for l in open(path) if "==" in l and not l.startswith("#")}
image, tested = pins("benchmarks/lease/device_image.txt"), pins("constraints/tested.txt")
image.pop("python", None)
merged = {**{k: v for k, v in tested.items() if not re.match(r"(nvidia-|cuda-|triton$|torch)", k)}, **image}
try:  # never through a link (O_NOFOLLOW): a link swapped in for the mktemp file would be overwritten
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
except OSError as err:
    sys.exit(f"error: cannot write the constraints file {sys.argv[1]} ({err.strerror}: refused, a link or not writable); "
             f"allowed: the regular file mktemp made")
with os.fdopen(fd, "w") as handle:
    handle.write("\n".join(merged.values()) + "\n")
EOF
  # what the lease's steps import from the image (rpevit's dependencies but Ray and fvcore, which the
  # lease carries; pytest, pytest-xdist and pytest-timeout; what Ray and fvcore need that the image has)
  "$VENV/bin/pip" install -q -c "$pins" torch==2.11.0 numpy timm einops pandas pyarrow pyyaml matplotlib \
      scikit-learn scipy tensorboard pytest pytest-xdist pytest-timeout click filelock msgpack packaging protobuf \
      requests portalocker tabulate tqdm pillow
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
# the lease runs its GPU tests with a per-test timeout (pytest-timeout, on the image): a venv built before has it too
"$VENV/bin/python" -c 'import pytest_timeout' 2> /dev/null \
    || "$VENV/bin/pip" install -q "$(grep '^pytest-timeout==' benchmarks/lease/device_image.txt)"
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

# a new folder each run, mode 700 (mktemp -d, as gpu_check.sh): a fixed name in a shared /tmp could be another
# user's folder, or a link they planted, and every file of the rehearsal would be written there
if [[ -z $WORK ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rehearsal.XXXXXX")
elif [[ ${REHEARSAL_RUNG:-0} != 1 ]]; then   # REHEARSAL_DIR: emptied, made anew (the rung's: rehearse_rung.sh's)
  rm -rf -- "$WORK"; mkdir -p -- "$(dirname -- "$WORK")"; mkdir -m 700 -- "$WORK"
fi
if [[ ${REHEARSAL_RUNG:-0} == 1 ]]; then   # the CIFAR-10 rung lease: its own script, in this venv
  step "3. the CIFAR-10 rung lease (benchmarks/lease/rehearse_rung.sh)"
  LEASE_PYTHON=$PWD/$VENV/bin/python REHEARSAL_DIR=$WORK/rung bash benchmarks/lease/rehearse_rung.sh "$data" 3
  step "done in $(( $(date +%s) - t_start )) s; files in $WORK/rung"
  exit 0
fi
export LEASE_PYTHON=$PWD/$VENV/bin/python LEASE_DIR=$WORK/machine LEASE_REHEARSAL=1 OUT=${REHEARSAL_OUT:-$WORK/out}
export LEASE_TIME_SCALE=${REHEARSAL_TIME_SCALE:-3} LEASE_TEST_WORKERS=2
mkdir -p "$OUT"
fail() { echo "error: $*" >&2; exit 1; }
first_checks() {   # what `first` must bring back: the imports work, every collected GPU test is in the XML
  grep -q "imports ok" "$OUT/imports.log" || fail "the lease's imports failed: $OUT/imports.log"
  local collected skipped
  [[ -f $OUT/pytest_gpu.collected ]] || fail "the GPU tests were not collected: $OUT/pytest_gpu.log"
  collected=$(wc -l < "$OUT/pytest_gpu.collected")
  skipped=$(grep -o 'skipped="[0-9]*"' "$OUT/pytest_gpu.xml" 2> /dev/null | head -1 | tr -dc 0-9 || true)
  (( collected > 0 )) && [[ $skipped == "$collected" ]] \
      || fail "tests/test_gpu.py: $collected collected, ${skipped:-no XML} skipped (all skip here): $OUT/pytest_gpu.log"
}

if [[ -n ${REHEARSAL_BUDGET_S:-} ]]; then   # the short lease: its own calls, as `gpu_lease.sh budget` prints them
  export LEASE_BUDGET_S=$REHEARSAL_BUDGET_S
  LEASE_TIME_SCALE=1 bash benchmarks/gpu_lease.sh budget | tee "$WORK/budget.txt"
  grep -q "^call 2: .*gpu_lease.sh main" "$WORK/budget.txt" \
      || fail "LEASE_BUDGET_S=$LEASE_BUDGET_S has no main call: rehearse a budget that has one (gpu_lease.sh budget)"
  step "3a. call 1: first; bench (LEASE_BUDGET_S=$LEASE_BUDGET_S, the plan's times x $LEASE_TIME_SCALE)"
  bash -c 'bash benchmarks/gpu_lease.sh first; bash benchmarks/gpu_lease.sh bench'
  first_checks
  "$LEASE_PYTHON" benchmarks/lease/rehearsal_checks.py bench "$OUT/throughput.json" || fail "the benchmark: $OUT/throughput.log"
  mkdir -p "$WORK/summary" && cp "$OUT"/pytest_gpu.* "$OUT"/throughput.json "$WORK/summary/"
  "$LEASE_PYTHON" benchmarks/lease/summary.py "$WORK/summary" > /dev/null || fail "summary.py on call 1's files"
  grep -q "collected ran\." "$WORK/summary/SUMMARY.md" || fail "SUMMARY.md does not say what ran: $WORK/summary"
  step "3b. call 2: main (the plan with the lease's deadline and the last lease's rate; a CPU-sized sweep)"
  bash benchmarks/gpu_lease.sh main || fail "main: $OUT/sweep.log"
  "$LEASE_PYTHON" benchmarks/lease/rehearsal_checks.py plan "$OUT/lease_plan.txt" || fail "the plan: $OUT/lease_plan.txt"
  [[ -f $OUT/trials.parquet && -f $OUT/curves.png ]] || fail "main brought back no rows or curves: $OUT/sweep.log"
  step "3c. group on a fresh machine (no first before it: it unpacks .lease itself)"
  LEASE_DIR=$WORK/fresh OUT=$WORK/fresh_out bash benchmarks/gpu_lease.sh group || fail "group: $WORK/fresh/sweep.log"
  [[ -f $WORK/fresh/site/.unpacked && -f $WORK/fresh_out/trials.parquet ]] || fail "group on a fresh machine: $WORK/fresh_out"
  step "done in $(( $(date +%s) - t_start )) s; files in $OUT and $WORK/fresh_out"
  exit 0
fi

export LEASE_BUDGET_S=${REHEARSAL_LONG_BUDGET_S:-1800}
step "3a. the lease's first call (imports, gpu tests collected and run: they skip here)"
bash benchmarks/gpu_lease.sh first
first_checks
step "3b. every all12 cell fused + compiled + bf16 against its eager solo steps (aot_eager)"
PYTHONPATH=$LEASE_DIR/site:$PWD "$LEASE_PYTHON" -m tests.all12_cells --device cpu --backend aot_eager \
    --json "$OUT/cells.json" | tee "$OUT/cells.log"
grep -q "24 of 24 cells ok" "$OUT/cells.log" || fail "all12 cells failed (aot_eager): $OUT/cells.log"
step "3c. the riskiest cells under Inductor's CPU backend"
PYTHONPATH=$LEASE_DIR/site:$PWD "$LEASE_PYTHON" -m tests.all12_cells --device cpu --backend inductor \
    --only softmax+luo_rpe --json "$OUT/cells_inductor_luo.json" | tee "$OUT/cells_inductor.log"
PYTHONPATH=$LEASE_DIR/site:$PWD "$LEASE_PYTHON" -m tests.all12_cells --device cpu --backend inductor \
    --only softmax+circulant --json "$OUT/cells_inductor_circulant.json" | tee -a "$OUT/cells_inductor.log"
step "3d. the lease's study call (benchmark; plan with the lease's deadline and estimate; a CPU-sized sweep)"
bash benchmarks/gpu_lease.sh study
grep -q '"mode": "solo eager"' "$OUT/throughput.json" || fail "no benchmark rows"
grep -q "fused group(s) of 3 fit" "$OUT/lease_plan.txt" || fail "no plan: $OUT/lease_plan.txt"
step "3e. the lease's finish call"
bash benchmarks/gpu_lease.sh finish
[[ -f $OUT/trials.parquet ]] || fail "the sweep brought back no rows: $OUT/sweep.log"
step "done in $(( $(date +%s) - t_start )) s; files in $OUT"
