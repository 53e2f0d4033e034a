#!/usr/bin/env bash
# The CIFAR-10 rung lease (issue 60, item 4) rehearsed on this CPU, call by call, as `gpu_lease.sh cifar-plan`
# plans it:
#
#   benchmarks/lease/rehearse_rung.sh DATA_DIR [EPOCHS]     (EPOCHS: the rung, default 3, the first)
#
# benchmarks/gpu_rehearsal.sh runs it (REHEARSAL_RUNG=1) in the image-like venv with the real .lease; it also
# runs alone, with LEASE_PYTHON (default python3) and LEASE_PACK (default .lease: a Python 3.12 venv for its
# wheels; another Python needs a pack whose site is empty, its packages then the venv's own).
# 1. .lease_cifar (gpu_lease.sh prepare-cifar DATA_DIR when missing) and the call plan (cifar_pack.py plan:
#    the carry lists, the bytes, the rung sweep's seconds);
# 2. each call on one machine folder ($REHEARSAL_DIR/machine: what stays warm between calls): the parts it
#    carries copied into a checkout-like folder (the device tool's copy; `receive` moves them out), then its
#    command with LEASE_REHEARSAL=1: `receive` in the calls before the last (each says how many parts are in,
#    call 1 unpacks .lease and records the image), `rung EPOCHS` in the last (cifar10.npz rebuilt from the
#    parts and its SHA-256 checked, plan.py --exact with the lease's own sweep seconds and the committed H100
#    rate, then ONE CPU-sized group of the rung through sweep.py and Ray on the rebuilt data, collected);
# 3. checks: every receive line, the rebuilt file's digest, the plan admitting every group of the rung, and
#    the files the rung call brings back (rows, space.json, declaration.json, curves, the plan).
# Not rehearsed here: the GPU's speed (the plan uses the committed rate; the sweep is CPU-sized, its trials
# keys are not the study's, so merge_rungs.py would refuse its rows: tests/test_lease_merge_rungs.py covers
# the merge), transfers and the device tool's 30-s idle limit.
# Exits non-zero on the first check that fails. Output: a new folder (mktemp -d, named at the end), or
# $REHEARSAL_DIR, emptied first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
data=${1:-${RPEVIT_DATA:-}}
epochs=${2:-3}
PY=${LEASE_PYTHON:-python3}
WORK=${REHEARSAL_DIR:-}   # empty: a new folder (step 2)
PACK_DIR=.lease_cifar
t_start=$(date +%s)
step() { echo; echo "== rung rehearsal [$(( $(date +%s) - t_start )) s] $*"; }
fail() { echo "error: $*" >&2; exit 1; }

step "1. the parts (.lease_cifar) and the call plan"
if [[ ! -d $PACK_DIR ]]; then
  [[ -n $data && -f $data/cifar10.npz ]] || fail "no cifar10.npz in '$data': pass DATA_DIR"
  LEASE_PYTHON=$PY bash benchmarks/gpu_lease.sh prepare-cifar "$data"
fi
export LEASE_BUDGET_S=${REHEARSAL_BUDGET_S:-810}
"$PY" benchmarks/lease/cifar_pack.py plan --lease "${LEASE_PACK:-.lease}"
export LEASE_RUNG_SWEEP_S
LEASE_RUNG_SWEEP_S=$("$PY" benchmarks/lease/cifar_pack.py plan --lease "${LEASE_PACK:-.lease}" --sweep-seconds)
mapfile -t calls < <("$PY" benchmarks/lease/cifar_pack.py plan --lease "${LEASE_PACK:-.lease}" --calls)
(( ${#calls[@]} >= 2 )) || fail "the plan has ${#calls[@]} call(s): $PACK_DIR is not a pack of several parts"
parts=$("$PY" -c 'import json,glob,sys; print(len(json.load(open(sorted(glob.glob(sys.argv[1] + "/part*/MANIFEST.json"))[0]))["parts"]))' "$PACK_DIR")

# a new folder each run, mode 700 (mktemp -d, as gpu_check.sh): a fixed name in a shared /tmp could be another
# user's folder, or a link they planted, and every file of the rehearsal would be written there
if [[ -n $WORK ]]; then   # REHEARSAL_DIR (the caller's, as gpu_rehearsal.sh's $WORK/rung): emptied, made anew
  rm -rf -- "$WORK"; mkdir -p -- "$(dirname -- "$WORK")"; mkdir -m 700 -- "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rehearsal_rung.XXXXXX")
fi
mkdir -p "$WORK/checkout/$PACK_DIR"
export LEASE_DIR=$WORK/machine LEASE_REHEARSAL=1 LEASE_TIME_SCALE=${REHEARSAL_TIME_SCALE:-3}
export LEASE_CIFAR_PACK=$WORK/checkout/$PACK_DIR LEASE_PYTHON=$PY
carried=0
# Each line comes from a manifest (untrusted): cifar_pack.py refuses a name with a tab or newline, and here only
# the two commands `plan --calls` writes may reach bash -c, and carry entries of plain names and '/'.
command_pattern='^export LEASE_BUDGET_S=[0-9]+; bash benchmarks/gpu_lease\.sh (receive|rung EPOCHS)$'
for line in "${calls[@]}"; do
  IFS=$'\t' read -r number carry command <<< "$line"
  [[ $number =~ ^[0-9]+$ && $carry =~ ^[A-Za-z0-9_./,-]*$ && $command =~ $command_pattern ]] \
      || fail "cifar_pack.py plan --calls line ${line@Q}; allowed: NUMBER<tab>carry of names<tab>one of its two commands"
  command=${command/rung EPOCHS/rung $epochs}
  step "2.$number call $number: carry=[$carry]; $command"
  for path in ${carry//,/ }; do
    [[ $path == "$PACK_DIR"/* ]] || continue   # .lease stays where gpu_lease.sh reads it (LEASE_PACK)
    cp -r "$path" "$WORK/checkout/$path"
    carried=$(( carried + 1 ))
  done
  export OUT=$WORK/out$number
  mkdir -p "$OUT"
  bash -c "$command" 2>&1 | tee "$WORK/call$number.log" || fail "call $number: $WORK/call$number.log"
  if (( number < ${#calls[@]} )); then
    grep -q "cifar10 pack [0-9a-f]*: $carried of $parts parts in" "$WORK/call$number.log" \
        || fail "call $number: no line '$carried of $parts parts in': $WORK/call$number.log"
  fi
  [[ -z $(ls -A "$WORK/checkout/$PACK_DIR") ]] || fail "call $number left parts in the checkout: $WORK/checkout"
done

step "3. what the rung call brought back"
grep -q "imports ok" "$WORK/out1/imports.log" || fail "call 1: the lease's imports failed: $WORK/out1/imports.log"
grep -q "$parts of $parts parts in .*none missing; .*rebuilt, sha256 .* ok" "$WORK/call${#calls[@]}.log" \
    || fail "cifar10.npz was not rebuilt with its digest checked: $WORK/call${#calls[@]}.log"
"$PY" benchmarks/lease/rehearsal_checks.py plan "$OUT/lease_plan.txt" || fail "the rung's plan: $OUT/lease_plan.txt"
grep -q "lease plan: \([0-9]*\) of \1 fused group" "$OUT/lease_plan.txt" || fail "the plan left groups out: $OUT/lease_plan.txt"
for f in trials.parquet epochs.parquet space.json declaration.json curves.png sweep.log; do
  [[ -f $OUT/$f ]] || fail "the rung call brought back no $f: $OUT/sweep.log"
done
"$PY" - "$OUT" "$LEASE_DIR/data" <<'EOF' || fail "the rows: $OUT"
import json, sys
from pathlib import Path
import pyarrow.parquet as pq
out, data = Path(sys.argv[1]), sys.argv[2]
rows = pq.read_table(out / "trials.parquet").to_pylist()
assert rows and all(r["status"] == "ok" and r["dataset"] == "cifar10" for r in rows), [r["status"] for r in rows]
assert {r["data_dir"] for r in rows} == {data}, {r["data_dir"] for r in rows}
assert json.loads((out / "declaration.json").read_text())["declarations"], "no declaration recorded"
print(f"rows: {len(rows)} ok, cifar10 from {data}, epochs {sorted({r['epochs'] for r in rows})}, "
      f"declaration recorded before them")
EOF
step "done in $(( $(date +%s) - t_start )) s; files in $WORK"
