#!/usr/bin/env bash
# One GPU lease of LEASE_BUDGET_S seconds from t0, the first call's start: the device tool lends 15 minutes of
# device time, the machine's start included (pass what its status says is left, less the start), runs a call
# for at most 600 s and keeps the machine only 30 s after a call; then it is gone, with everything on it.
#
# Here, once (needs PyPI and DATA_DIR/mnist.npz):   benchmarks/gpu_lease.sh prepare DATA_DIR
#   packs the wheels of benchmarks/lease/wheels.txt, installed into one folder (ray without ray/jars),
#   as .lease/site.tar.xz, with mnist.npz and their SHA-256 (~45 MB: one call carries 64 MiB).
# The plan, without running anything:               LEASE_BUDGET_S=810 benchmarks/gpu_lease.sh budget
#   each call's command, its start and end from t0 and its parts (benchmarks/lease/timeline.py). Every part
#   runs under `timeout` until its end there (its stop signal 20 s before), so no part overruns its call
#   and no call its 600 s; a part whose time has gone is skipped, saying so.
# Rehearse it on this CPU first:                    REHEARSAL_BUDGET_S=810 benchmarks/gpu_rehearsal.sh DATA_DIR
# The short lease (under 1500 s), each call with timeout_s 600, the second within 30 s of the first:
#   call 1, carry=[.lease]:  export LEASE_BUDGET_S=810; bash benchmarks/gpu_lease.sh first; bash benchmarks/gpu_lease.sh bench
#     first  .lease checked and unpacked into $LEASE_DIR, image.txt, imports.log; the GPU tests collected
#            (pytest_gpu.collected: one test id a line), then run (-n 6, pytest-timeout per test; SIGINT
#            before the end, so pytest_gpu.xml holds what ran: summary.py says "N of M collected ran"),
#            tests/test_gpu_whole_step.py first (the gate for all12's `compile: graph`, never reached before)
#     bench  throughput.py: 4 packed processes of a fused k=5 group with CUDA graphs without, then with MPS,
#            side by side (the open question of the 2026-11-27 lease, and the packed rate call 2 plans with);
#            then the one-process baseline (fused k=5) and the same group with the whole step in one graph
#            (compile: graph; measured on 2026-11-27), then solo eager and compiled, as time remains; the
#            two fused modes profiled (throughput.json, .log)
#   call 2, carry=[.lease]:  export LEASE_BUDGET_S=810 LEASE_LEFT_S=<budget_left_s of call 1's reply, less the
#                            seconds until this call is sent>; bash benchmarks/gpu_lease.sh main [--set/--only ...]
#     main   the all12 MNIST half (12 fused groups of 3 seeds, compiled, bf16) through sweep.py: Ray packs 4
#            groups per GPU, plan.py picks the epochs from call 1's packed rate, --deadline starts only
#            whole groups that fit; SIGTERM at the sweep's end; its rows (parts/ too: rpevit.sweep.snapshot:
#            trials.parquet, epochs.parquet), space.json, sweep.log, lease_plan.txt, curves.png, smi.txt
#            back. Where the plan admits no group, or the sweep's own planner (seconds later) admits none, one
#            fused group runs instead (as `group`). On a fresh machine call 1's rate is not there: the plan
#            uses the committed one (LEASE_RUNG_THROUGHPUT), and says so.
#   LEASE_LEFT_S caps every part of a call after the first at the device time really left (the machine's
#   start may have taken more than the budget assumed); on a fresh machine (the 30-s window missed) START_S
#   more, since its start came before the command. .lease carried again costs seconds and saves call 2 if
#   the machine went cold (a fresh one unpacks it: without it the call ends at once, its start spent).
#   Every log back is its last 2 MB; smi.txt is left out of a call that already returns 8 files.
#   then give the machine back. `group [SWEEP FLAGS]`: one fused group (MNIST favor + luo_rpe, 2 epochs if
#   its time allows, else 1) through sweep.py instead of the main job.
# `longseq [SWEEP FLAGS]` (issue 60, item 5; carry=[.lease], no data): the data-free long-sequence bench,
#   search_spaces/token_scaling_gpu.yaml (55 rows, N = 64 to 16,384), until the call's end; its rows back for
#   `python analysis/token_scaling.py FOLDER --write-crossover` (luo_crossover.json's cuda entry).
# bench, main and group unpack .lease themselves on a fresh machine (carry=[.lease]); they take their
# times from t0 when `first` ran on this machine, else from their own start.
# The long lease (1500 to 1800 s, planned for issue 40): `first`, `study` (benchmark, plan, a sweep in the
# background until t0 + budget - 300 s), `finish` (wait, collect).
# LEASE_GPU_TESTS: the GPU test files `first` runs, in order (default tests/test_gpu_whole_step.py tests/test_gpu.py).
# LEASE_TESTS_S / LEASE_BENCH_S: a part's seconds by hand (0 skips it). LEASE_TIME_SCALE: every time of
# the plan times this (the tests of the caps; the CPU rehearsal). LEASE_REHEARSAL=1 (gpu_rehearsal.sh):
# the same steps on a CPU, CPU-sized; the GPU tests collect and skip, and the plan is still asked with
# the lease's deadline and the last measured GPU rate.
#
# The CIFAR-10 rung lease (issue 60, item 4): one rung of search_spaces/cifar10_rungs_gpu.yaml (a declared study:
# softmax and FAVOR+ x 4 encodings x seeds 10-12, all12's CIFAR-10 model and recipe) per lease, with CIFAR-10
# carried in parts (the device tool sends 64 MiB a call, the working tree included; cifar10.npz is 169.6 MB).
# Here, once (after `prepare`):                       benchmarks/gpu_lease.sh prepare-cifar DATA_DIR
#   .lease_cifar/partN/: the four arrays as a stored npz, xz-compressed through delta filters (114.9 MB, 0.62
#   of it) and cut into parts, part 1 sized to travel beside .lease, each with MANIFEST.json (SHA-256 of every
#   part and of the npz the lease rebuilds): benchmarks/lease/cifar_pack.py.
# The calls, their carry lists and bytes:            LEASE_BUDGET_S=810 benchmarks/gpu_lease.sh cifar-plan
#   and, per rung, whether plan.py fits it in the last call (whole, or as halves: --only attention=...).
# The calls (each timeout_s 600, the next within 30 s of the last; cifar-plan prints the exact carry lists):
#   call 1, carry=[.lease, .lease_cifar/part1]:  export LEASE_BUDGET_S=810; bash benchmarks/gpu_lease.sh receive
#   call 2, carry=[.lease_cifar/part2]:          export LEASE_BUDGET_S=810; bash benchmarks/gpu_lease.sh receive
#   ... (one receive call per further part: 3 or 4 parts in all, as the working tree's size leaves room)
#   last call, carry=[.lease_cifar/partN]:       export LEASE_BUDGET_S=810; bash benchmarks/gpu_lease.sh rung 3
#     receive  each carried part checked (size, SHA-256) and moved out of the checkout into $LEASE_DIR; one line
#              says how many parts are in and which are missing; once all are in, cifar10.npz is rebuilt into
#              $LEASE_DIR/data and its SHA-256 checked; .lease (when carried) checked and unpacked, image.txt
#     rung EPOCHS [--only FIELD=VALUE ...]  receive first; then plan.py --exact (every group of the rung before
#              the call's end, else nothing starts), sweep.py --only epochs=EPOCHS --data-dir $LEASE_DIR/data
#              --deadline, SIGTERM at its end; rows (rpevit.sweep.snapshot), space.json, declaration.json,
#              sweep.log, lease_plan.txt, curves.png (the device named), smi.txt back. A rung too long for one
#              call runs as halves in two leases (rung 6 --only attention=softmax, then attention=favor).
#              The study's declaration.json, once merged into results/cifar10_rungs_gpu, is seeded into the
#              sweep folder first, so every lease records the same one.
#   then give the machine back, put $OUT's files in results/gpu_<kind>/lease_<date>/cifar10_rungs_gpu/ and
#   run benchmarks/lease/merge_rungs.py (every lease's rows read as one study in results/cifar10_rungs_gpu).
# LEASE_CIFAR_PACK: the parts' folder in the checkout (default .lease_cifar). LEASE_RUNG_THROUGHPUT: the measured
# rate the rung's plan uses (default the H100's packed rate of 2026-11-26).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${LEASE_PYTHON:-python3}
L=${LEASE_DIR:-/tmp/lease}
# $L is one fixed path on purpose: the calls of a lease (first, bench, main; receive ..., rung) are separate
# invocations that share it (t0, the unpacked site, the parts, the sweep). In a shared /tmp anyone could make it
# first (a link to a folder of theirs, or a folder of theirs), and everything written in it would go there: made
# here with mode 700 when missing, then used only if it is a real folder of this user that others cannot write.
[[ -L $L || -e $L ]] || { mkdir -p -- "$(dirname -- "$L")" && mkdir -m 700 -- "$L" 2> /dev/null; }
if [[ -L $L ]]; then
  echo "error: LEASE_DIR $L is a symbolic link (to '$(readlink -- "$L")'); allowed: a folder of this user, or" \
       "nothing there (it is made, mode 700): remove the link, or set LEASE_DIR to a folder of your own" >&2
  exit 2
fi
if [[ ! -d $L || ! -O $L || -n $(find "$L" -maxdepth 0 -perm -o+w 2> /dev/null) ]]; then
  echo "error: LEASE_DIR $L is not a folder of this user ($(id -un)) that others cannot write (it is" \
       "$(stat -c '%F, owner %U, mode %a' -- "$L" 2> /dev/null || echo 'not there')); allowed: a folder of this" \
       "user without write for others, or nothing there (it is made, mode 700): remove it, or set LEASE_DIR" >&2
  exit 2
fi
OUT=${OUT:-$L/out}
# resolved once (a link the machine or the user made is theirs): what is written in it goes through writers that
# never follow a link at the file or its folder (rpevit.sweep.results.atomic_file), which would refuse a linked $OUT
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)
PACK=${LEASE_PACK:-.lease}
REHEARSAL=${LEASE_REHEARSAL:-0}
WORKERS=${LEASE_TEST_WORKERS:-6}
read -ra GPU_TESTS <<< "${LEASE_GPU_TESTS:-tests/test_gpu_whole_step.py tests/test_gpu.py}"   # what `first` collects and runs
SPACE=search_spaces/all12.yaml
LONGSEQ_SPACE=search_spaces/token_scaling_gpu.yaml   # `longseq`: issue 60, item 5
MAIN_FLAGS=(--only dataset=mnist)   # the main job: the MNIST half of all12; the budget (epochs) is the plan's
REHEARSAL_SWEEP=(--only dataset=mnist --only attention=softmax --only pe=luo_rpe --set train_subset=384
                 --set device=cpu --gpus-per-trial 0 --cpus-per-trial 1)   # one CPU-sized group
# the packed rate the rehearsal's plan is asked with (its own benchmark runs a tiny CPU model): the last lease's
REHEARSAL_RATE=${LEASE_REHEARSAL_THROUGHPUT:-results/gpu_h100/lease_2026-11-26/throughput_packed.json}
CIFAR_PACK=${LEASE_CIFAR_PACK:-.lease_cifar}   # the parts a call carried (moved out by `receive`)
RUNG_SPACE=search_spaces/cifar10_rungs_gpu.yaml
RUNG_NAME=cifar10_rungs_gpu
# a rung lease runs no benchmark: its plan uses the last measured packed rate (pessimistic: `compile: cudagraphs`
# packed; the H200's `compile: on` packed rate was higher)
RUNG_RATE=${LEASE_RUNG_THROUGHPUT:-results/gpu_h100/lease_2026-11-26/throughput_packed.json}
# the rehearsal's rung: one CPU-sized group of the rung (the plan before it is the lease's own)
REHEARSAL_RUNG=(--only attention=favor --only pe=luo_rpe --set train_subset=384 --set dim=32 --set depth=1
                --set heads=2 --set compile=off --set eval_draws=2 --set device=cpu --gpus-per-trial 0 --cpus-per-trial 1)

prepare() {
  local data=${1:?prepare needs the folder holding mnist.npz}
  local stage; stage=$(mktemp -d)
  local pick=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
              --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  local wanted; wanted=$(grep -v '^#' benchmarks/lease/wheels.txt | grep -v -E '^(fvcore|iopath|yacs)==' | xargs)
  local built; built=$(grep -E '^(fvcore|iopath|yacs)==' benchmarks/lease/wheels.txt | xargs)
  mkdir -p "$stage/wheels" .lease || return 1
  "$PY" -m pip download -q "${pick[@]}" -d "$stage/wheels" $wanted || return 1
  "$PY" -m pip wheel -q --no-deps -w "$stage/wheels" $built || return 1   # sdists only: pure-Python wheels
  "$PY" -m pip install -q --no-index "${pick[@]}" --no-compile --target "$stage/site" "$stage"/wheels/*.whl || return 1
  rm -rf "$stage/site/ray/jars" "$stage/site/bin"   # Java workers: never loaded by a Python sweep
  tar cf - -C "$stage/site" . | xz -T0 -6 > .lease/site.tar.xz || return 1
  cp "$data/mnist.npz" .lease/ || return 1
  (cd .lease && sha256sum site.tar.xz mnist.npz > SHA256SUMS)
  ls "$stage/wheels" > .lease/WHEELS
  rm -rf "$stage"
  ls -la .lease
}

case "${1:-}" in
  prepare) prepare "${2:-}"; exit $? ;;
  prepare-cifar)
    [[ -n ${2:-} ]] || { echo "error: prepare-cifar needs DATA_DIR, the folder holding cifar10.npz" >&2; exit 2; }
    exec "$PY" benchmarks/lease/cifar_pack.py prepare "$2" --out "$CIFAR_PACK" --lease "$PACK" ;;
  cifar-plan)
    "$PY" benchmarks/lease/cifar_pack.py plan --pack "$CIFAR_PACK" --lease "$PACK" --budget "${LEASE_BUDGET_S:-810}" \
        || exit $?
    sweep_s=$("$PY" benchmarks/lease/cifar_pack.py plan --pack "$CIFAR_PACK" --lease "$PACK" \
        --budget "${LEASE_BUDGET_S:-810}" --sweep-seconds) || exit 2
    exec "$PY" benchmarks/lease/cifar_pack.py rungs --space "$RUNG_SPACE" --deadline-s "$sweep_s" \
        --throughput "$RUNG_RATE" results/gpu_h100/lease_2026-11-27/throughput.json ;;
  budget) [[ -n ${LEASE_BUDGET_S:-} ]] || { echo "error: LEASE_BUDGET_S is not set; allowed: the lease's seconds" \
              "from t0 (the device's budget_left_s less the machine's start), e.g. LEASE_BUDGET_S=810" >&2; exit 2; }
          exec "$PY" benchmarks/lease/timeline.py "$LEASE_BUDGET_S" ;;
  first|bench|main|group|study|finish|receive|rung|longseq) ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;   # the header
esac
# BUDGET_S, CALL_END_S, RETURN_S, UNPACK_S, PLAN_S, COLLECT_S, GRACE_S, QUICK_GRACE_S, TEST_TIMEOUT_S,
# TEST_COLLECT_S, GROUP_TWO_EPOCHS_S, LEASE_KIND, CALL2 and the parts' ends from t0: the numbers `budget` prints
if [[ -z ${LEASE_BUDGET_S:-} ]]; then   # no default: a forgotten export planned the 30-minute lease on a 15-minute lend
  echo "error: LEASE_BUDGET_S is not set; allowed: the lease's seconds from t0 (the device's budget_left_s less the" \
       "machine's start), e.g. export LEASE_BUDGET_S=810 (gpu_lease.sh budget prints its plan)" >&2
  exit 2
fi
if [[ -n ${LEASE_LEFT_S:-} && ! ${LEASE_LEFT_S} =~ ^(0|[1-9][0-9]{0,4})$ ]]; then
  echo "error: LEASE_LEFT_S has value '$LEASE_LEFT_S'; allowed: whole seconds of device time left as this call" \
       "starts (the last reply's lease.budget_left_s less the seconds since), or unset" >&2
  exit 2
fi
plan_values=$("$PY" benchmarks/lease/timeline.py "$LEASE_BUDGET_S" --shell) || exit 2
eval "$plan_values"
if [[ $LEASE_KIND == long && $1 =~ ^(bench|main|group)$ ]]; then
  echo "error: gpu_lease.sh $1 is a call of the short lease; LEASE_BUDGET_S=$BUDGET_S is a long one (1500 s or" \
       "more): allowed: its calls first, study, finish (gpu_lease.sh budget)" >&2
  exit 2
fi
if [[ $LEASE_KIND == short && $1 == study ]]; then
  echo "error: a lease of LEASE_BUDGET_S=$BUDGET_S s (under 1500) has no study call; allowed: its calls first;" \
       "bench, then main (gpu_lease.sh budget prints them)" >&2
  exit 2
fi

mkdir -p "$L/site" "$L/results" "$L/data" "$OUT"
LOG_BYTES=2000000   # every log back is its last 2 MB (a call returns files of at most 16 MiB)
RETURN_FILES=8      # a call returns at most 8 files
export PYTHONPATH=$L/site:$PWD PYTHONUNBUFFERED=1 RPEVIT_DATA=$L/data
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}  # several compiling processes at once

# t0: `first` starts the lease; a later call on this machine keeps its t0, a call on a fresh one starts its own
STARTED=$(date +%s)   # this call's start (LEASE_LEFT_S counts from it)
new_t0() { echo "$STARTED" > "$L/t0"; T0=$(cat "$L/t0"); }   # a call that starts t0 starts it at its own start
FRESH=0   # 1: a call after the first found a bare machine (no t0 of an earlier call here): its start came first
keep_t0() {
  [[ -f $L/t0 ]] || { echo "$STARTED" > "$L/t0"; FRESH=1; }
  T0=$(cat "$L/t0")
  (( FRESH )) && [[ -n ${LEASE_LEFT_S:-} ]] && echo "lease: a fresh machine (no earlier call's t0 here): its start," \
      "~${START_S} s of device time, came out of LEASE_LEFT_S ($LEASE_LEFT_S s) before this call began"
  return 0
}
since_t0() { echo $(( $(date +%s) - T0 )); }
# this call's end from t0: CALL_END_S after its start, and never after the budget's end less the return, nor
# (LEASE_LEFT_S given) after the device time really left less the return
call_end() {
  local end=$(( $(since_t0) + CALL_END_S ))
  (( end > BUDGET_S - RETURN_S )) && end=$(( BUDGET_S - RETURN_S ))
  if [[ -n ${LEASE_LEFT_S:-} ]]; then
    local left=$(( STARTED - T0 + LEASE_LEFT_S - RETURN_S - FRESH * START_S ))
    (( end > left )) && end=$left
  fi
  echo "$end"
}

# capped END SIGNAL GRACE CMD...: CMD until t0 + END: SIGNAL GRACE s before END (pytest writes its XML, sweep.py
# shuts Ray down, the benchmark stops MPS), SIGKILL at END, to CMD's whole process group (GNU timeout); a
# part whose time has gone is skipped. Returns CMD's status, 124 when cut or skipped.
capped() {
  local end=$1 sig=$2 grace=$3; shift 3
  local left=$(( end - $(since_t0) ))
  if (( left <= 0 )); then
    echo "lease: skipped at t0+$(since_t0) s, its time ended at t0+$end s: $*"
    return 124
  fi
  local at=$(( left - grace )); (( at < 1 )) && at=1
  local kill=$(( left - at )); (( kill < 1 )) && kill=1
  timeout -s "$sig" -k "$kill" "$at" "$@"
  local rc=$?
  (( rc == 124 || rc == 137 )) && echo "lease: cut at t0+$(since_t0) s (its end: t0+$end s): $*"
  return $rc
}

# .lease checked and unpacked into $L (once a machine: the marker says it was), until t0 + $1
ensure_site() {
  [[ -f $L/site/.unpacked ]] && return 0
  if [[ ! -f $PACK/site.tar.xz ]]; then
    echo "error: $L/site is not unpacked and $PACK/site.tar.xz is missing: carry .lease (carry=[.lease]; a fresh" \
         "machine) or build it here first (gpu_lease.sh prepare DATA_DIR)" >&2
    return 3
  fi
  rm -rf "$L/site"; mkdir -p "$L/site" "$L/data"
  capped "$1" TERM "$QUICK_GRACE_S" bash -c 'set -eo pipefail; cd "$1"; sha256sum -c --quiet SHA256SUMS
      xz -dc site.tar.xz | tar xf - -C "$2/site"; cp mnist.npz "$2/data/"' unpack "$PACK" "$L" || return 3
  touch "$L/site/.unpacked"
}

record_image() {   # the image's Python, torch, GPU and packages (image.txt), and that the lease's imports work
  local end=$1
  { capped "$end" TERM "$QUICK_GRACE_S" "$PY" -c \
        'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
    command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi
    capped "$end" TERM "$QUICK_GRACE_S" "$PY" -m pip list --format=freeze; } > "$OUT/image.txt" 2>&1
  capped "$end" TERM "$QUICK_GRACE_S" "$PY" -c \
      'import ray.tune, sweep, rpevit.sweep.tune_run, tests.test_gpu; print("imports ok")' 2>&1 \
      | tee "$OUT/imports.log" | tail -3
}

# the GPU tests until t0 + $1: collected first (pytest_gpu.collected, the ids), so a run cut at its time limit
# reads as cut (summary.py: "N of M collected ran"); each test at most TEST_TIMEOUT_S (pytest-timeout's
# thread method: a hang in CUDA ends its worker, xdist starts another); SIGINT before the end
gpu_tests() {
  local end=$1 collect_end=$(( $(since_t0) + TEST_COLLECT_S ))
  (( collect_end > end )) && collect_end=$end
  capped "$collect_end" TERM "$QUICK_GRACE_S" "$PY" -m pytest --collect-only -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider \
      > "$L/collect.log" 2>&1
  grep '::' "$L/collect.log" > "$OUT/pytest_gpu.collected"
  echo "collected $(wc -l < "$OUT/pytest_gpu.collected") GPU tests ($(tail -1 "$L/collect.log"))"
  capped "$end" INT "$GRACE_S" "$PY" -m pytest -q -m gpu "${GPU_TESTS[@]}" -n "$WORKERS" -p no:cacheprovider -rfE \
      --timeout "$TEST_TIMEOUT_S" --timeout-method thread --junitxml "$OUT/pytest_gpu.xml" 2>&1 \
      | tee "$L/pytest_gpu.log" | tail -40
  tail -c "$LOG_BYTES" "$L/pytest_gpu.log" > "$OUT/pytest_gpu.log"   # a file over the return's 16 MiB never comes back
}

# the throughput benchmark until t0 + $1; $2 short: the short lease's question first (4 packed processes of fused
# k=5 with CUDA graphs without and with MPS, then the one-process fused modes, then the solo modes; the fused
# modes profiled), long: every mode, profiled. A rehearsal runs the same order on the tiny model (no MPS without CUDA).
run_bench() {
  local end=$1 args
  if [[ $REHEARSAL == 1 ]]; then
    args=(--models tiny --fused 3 --packed 2 --samples 3 --steps 1 --warmup 1 --backend aot_eager --profile-steps 1)
    [[ $2 == short ]] && args+=(--modes packed fused whole eager compiled --profile-modes fused whole)
  elif [[ $2 == short ]]; then
    args=(--models gpu --fused 5 --packed 4 --samples 3 --steps 10 --warmup 3 --compile cudagraphs
          --modes packed mps fused whole eager compiled --profile-steps 5 --profile-modes fused whole)
  else
    args=(--models gpu --fused 3 5 --packed 4 --samples 3 --steps 10 --warmup 3 --profile-steps 5)
  fi
  capped "$end" TERM "$GRACE_S" "$PY" benchmarks/throughput.py "${args[@]}" --json "$OUT/throughput.json" 2>&1 \
      | grep --line-buffered -v Warning | tee "$L/throughput.log"
  tail -c "$LOG_BYTES" "$L/throughput.log" > "$OUT/throughput.log"
  cp "$OUT/throughput.json" "$L/throughput.json" 2> /dev/null
  return 0
}

minutes() { printf '%d.%02dm' $(( $1 / 60 )) $(( $1 % 60 * 100 / 60 )); }   # --deadline's duration

# the main job until t0 + $1 (the sweep's end): plan.py's epochs and estimate for the groups that end before
# the sweep's stop signal, then sweep.py with that --deadline; where no group fits, one group instead
run_main() {
  local end=$1; shift
  # plan.py plans some seconds before sweep.py does (sweep.py's imports and its own planning come after), so the
  # sweep's planner may admit fewer groups, or none: then one group runs instead (below). Not given less time
  # here: at the H100's measured rate 4 groups fit the 810-s lease's 195 s and none fit 175 s
  local flags=("${MAIN_FLAGS[@]}" "$@") deadline=$(( end - GRACE_S - $(since_t0) )) rate=$L/throughput.json
  if [[ ! -f $rate ]]; then   # a fresh machine: call 1's rate stayed on the machine that measured it
    rate=$RUNG_RATE
    echo "lease: no rate of this lease on this machine (a fresh one): planning with the committed $rate"
  fi
  [[ $REHEARSAL == 1 ]] && { deadline=${LEASE_MAIN_SWEEP_S:-$deadline}; rate=$REHEARSAL_RATE; }  # the lease's own
  capped $(( $(since_t0) + PLAN_S )) TERM "$QUICK_GRACE_S" "$PY" benchmarks/lease/plan.py --deadline-s "$deadline" \
      --throughput "$rate" "${flags[@]}" > "$L/plan.txt" 2>&1
  local rc=$?
  cp "$L/plan.txt" "$OUT/lease_plan.txt"; cat "$L/plan.txt"
  if (( rc != 0 )); then
    grep -q "admits no group" "$L/plan.txt" || return 2
    echo "lease: no whole group of the main job fits by t0+$end s: one fused group instead"
    run_group "$end"
    return
  fi
  local epochs est
  read -r epochs est < <(tail -1 "$L/plan.txt")
  local run=(--set "epochs=$epochs" --deadline-estimate "$est")
  [[ $REHEARSAL == 1 ]] && { flags=("${REHEARSAL_SWEEP[@]}"); run=(--set epochs=1 --deadline-estimate 60); }
  deadline=$(( end - GRACE_S - $(since_t0) ))
  (( deadline > 0 )) || { echo "lease: no time left for the sweep (its end: t0+$end s)"; return 124; }
  echo "lease: sweep.py ${flags[*]} ${run[*]} --deadline $(minutes "$deadline") at t0+$(since_t0) s"
  capped "$end" TERM "$GRACE_S" "$PY" sweep.py --space $SPACE --results-dir "$L/results" --no-dashboard "${flags[@]}" \
      "${run[@]}" --deadline "$(minutes "$deadline")" > "$L/sweep.log" 2>&1
  local rc=$?
  if grep -q "ran 0 trial(s)" "$L/sweep.log" 2> /dev/null; then   # its planner admitted none after all
    cp "$L/sweep.log" "$L/sweep_main.log"
    echo "lease: the sweep's planner admitted no group by t0+$end s: one fused group instead"
    run_group "$end"
    return
  fi
  return $rc
}

# one fused all12 group through sweep.py until t0 + $1 (SIGTERM before it): by default MNIST favor + luo_rpe,
# 3 seeds, 2 epochs where it has GROUP_TWO_EPOCHS_S, else 1 (a fixed budget, not a study result), compiled
# as all12.yaml says; further arguments go to sweep.py (e.g. --set compile=cudagraphs)
run_group() {
  local end=$1; shift
  local epochs=1
  (( end - GRACE_S - $(since_t0) >= GROUP_TWO_EPOCHS_S )) && epochs=2
  local run=(--only dataset=mnist --only attention=favor --only pe=luo_rpe --set "epochs=$epochs")
  [[ $REHEARSAL == 1 ]] && run=("${REHEARSAL_SWEEP[@]/softmax/favor}" --set epochs=1)
  echo "lease: one group, sweep.py ${run[*]} $* until t0+$end s"
  capped "$end" TERM "$GRACE_S" "$PY" sweep.py --space $SPACE --results-dir "$L/results" --no-dashboard "${run[@]}" \
      "$@" > "$L/sweep.log" 2>&1
}

device_label() {   # the figure's device where the rows do not name it
  if command -v nvidia-smi > /dev/null; then timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader | head -1
  else echo "cpu (rehearsal)"; fi
}

# until t0 + $1: the sweep's rows so far (folder $2 of $L/results, default all12), read as the analysis reads them
# (the compacted files and the parts a running or cut sweep holds: rpevit.sweep.snapshot), its space.json and
# declaration.json, its log, per-epoch curves naming the device, nvidia-smi
collect() {
  local end=$1 name=${2:-all12}
  local folder=$L/results/$name snap=$L/snapshot/$name
  [[ -f $L/sweep.log ]] && tail -c "$LOG_BYTES" "$L/sweep.log" > "$OUT/sweep.log"
  rm -rf "$L/snapshot"
  if [[ -d $folder ]] && capped "$end" TERM "$QUICK_GRACE_S" "$PY" -m rpevit.sweep.snapshot "$folder" "$snap"; then
    for f in trials.parquet epochs.parquet space.json declaration.json; do [[ -f $snap/$f ]] && cp "$snap/$f" "$OUT/$f"; done
    [[ -f $snap/epochs.parquet ]] && capped "$end" TERM "$QUICK_GRACE_S" "$PY" benchmarks/lease/curves.py "$snap" \
        "$OUT/curves.png" "$(device_label)"
  fi
  if (( $(find "$OUT" -maxdepth 1 -type f | wc -l) < RETURN_FILES )); then   # the rows first: smi.txt only where
    command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi --query-gpu=name,utilization.gpu,memory.used \
        --format=csv > "$OUT/smi.txt" 2>&1                               # a call returns fewer than 8 files
  fi
  return 0
}
sweep_running() { [[ -f $L/sweep.pid ]] && kill -0 "$(cat "$L/sweep.pid")" 2> /dev/null; }

# the CIFAR-10 parts this call carried, checked and moved into $L (cifar10.npz rebuilt once all are in), until
# t0 + $1; further arguments to cifar_pack.py receive (--require-complete: exit 4 unless cifar10.npz is rebuilt)
take_parts() {
  local end=$1; shift
  capped "$end" TERM "$QUICK_GRACE_S" "$PY" benchmarks/lease/cifar_pack.py receive --pack "$CIFAR_PACK" --into "$L" "$@"
}

# `rung EPOCHS [--only FIELD=VALUE ...]`'s arguments: a whole number, and nothing but --only pairs after it (a
# --set would make trials the declared study does not hold)
check_rung_args() {
  [[ ${1:-} =~ ^[1-9][0-9]{0,3}$ ]] || { echo "error: gpu_lease.sh rung EPOCHS: EPOCHS has value '${1:-}'; allowed:" \
      "one of the rungs of $RUNG_SPACE (its grid's epochs; gpu_lease.sh cifar-plan lists them)" >&2; return 2; }
  shift
  while (( $# )); do
    [[ $1 == --only && ${2:-} == *=* ]] || { echo "error: gpu_lease.sh rung: argument '$1' ${2:+'$2' }is not" \
        "allowed; allowed: --only FIELD=VALUE pairs (a part of the rung, e.g. --only attention=softmax)" >&2; return 2; }
    shift 2
  done
}

# one rung of the declared CIFAR-10 study until t0 + $1 (the sweep's end): plan.py --exact with this call's
# deadline (every group of the rung must fit, else nothing starts), then sweep.py with that --deadline
run_rung() {
  local end=$1 epochs=$2; shift 2
  # plan.py --exact is given PLAN_S less than the sweep, which plans after its own imports: a rung it admits is
  # admitted whole by the sweep too (a rung cut short is an incomplete declared cell; the rungs of
  # cifar10_rungs_gpu.yaml end by ~380 s of the rung call's 430, so PLAN_S costs none of them)
  local flags=(--only "epochs=$epochs" "$@") deadline=$(( end - GRACE_S - PLAN_S - $(since_t0) ))
  [[ $REHEARSAL == 1 ]] && deadline=${LEASE_RUNG_SWEEP_S:-$deadline}   # the lease's own (cifar_pack.py plan)
  capped $(( $(since_t0) + PLAN_S )) TERM "$QUICK_GRACE_S" "$PY" benchmarks/lease/plan.py --space $RUNG_SPACE --exact \
      --deadline-s "$deadline" --throughput "$RUNG_RATE" "${flags[@]}" > "$L/plan.txt" 2>&1
  local rc=$?
  cp "$L/plan.txt" "$OUT/lease_plan.txt"; cat "$L/plan.txt"
  (( rc == 0 )) || { echo "lease: rung epochs=$epochs ${*} does not fit by t0+$end s: nothing started"; return 2; }
  local est
  read -r _ est < <(tail -1 "$L/plan.txt")
  local run=(--deadline-estimate "$est")
  [[ $REHEARSAL == 1 ]] && { flags+=("${REHEARSAL_RUNG[@]}"); run=(--deadline-estimate 60); }
  deadline=$(( end - GRACE_S - $(since_t0) ))
  (( deadline > 0 )) || { echo "lease: no time left for the rung (its end: t0+$end s)"; return 124; }
  echo "lease: sweep.py --space $RUNG_SPACE ${flags[*]} ${run[*]} --deadline $(minutes "$deadline") at t0+$(since_t0) s"
  capped "$end" TERM "$GRACE_S" "$PY" sweep.py --space $RUNG_SPACE --results-dir "$L/results" --data-dir "$L/data" \
      --no-dashboard "${flags[@]}" "${run[@]}" --deadline "$(minutes "$deadline")" > "$L/sweep.log" 2>&1
}

# the study's declaration as merged so far (results/cifar10_rungs_gpu/declaration.json, committed after the first
# lease): copied into this lease's sweep folder before the sweep, so the driver finds it recorded and every lease's
# rows carry one declaration (merge_rungs.py refuses a lease whose declaration differs)
seed_declaration() {
  local merged=results/$RUNG_NAME/declaration.json folder=$L/results/$RUNG_NAME
  [[ -f $merged && ! -f $folder/declaration.json ]] || return 0
  mkdir -p "$folder" && cp "$merged" "$folder/declaration.json" && echo "lease: $merged seeded into $folder"
}

case "$1" in
first)
  new_t0
  ensure_site "$UNPACK_END" || exit 3
  record_image "$UNPACK_END"
  gpu_tests "$TESTS_END"
  echo "first call done at t0+$(since_t0) s (its end in the plan: t0+$TESTS_END s)"
  ;;
bench)
  keep_t0
  ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
  run_bench "$BENCH_END" short
  echo "benchmark done at t0+$(since_t0) s (its end in the plan: t0+$BENCH_END s)"
  ;;
main|group)
  command=$1; shift
  keep_t0
  end=$(call_end)
  ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
  if [[ $command == main ]]; then run_main $(( end - COLLECT_S )) "$@"; else run_group $(( end - COLLECT_S )) "$@"; fi
  rc=$?
  collect "$end"
  grep -v -i warn "$L/sweep.log" 2> /dev/null | tail -25; ls -la "$OUT"
  echo "$command call done at t0+$(since_t0) s (its end: t0+$end s)"
  exit $rc
  ;;
study)
  shift; flags=("$@"); (( ${#flags[@]} )) || flags=("${MAIN_FLAGS[@]}")
  keep_t0
  end=$(call_end)
  ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
  run_bench $(( $(since_t0) + BENCH_S )) long
  left=$(( STUDY_END_S - $(since_t0) ))
  [[ $REHEARSAL == 1 ]] && left=$LEASE_STUDY_PLAN_S   # the lease's: its plan is made ~13 min in
  capped $(( $(since_t0) + PLAN_S )) TERM "$QUICK_GRACE_S" "$PY" benchmarks/lease/plan.py --deadline-s "$left" \
      --throughput "$L/throughput.json" "${flags[@]}" > "$L/plan.txt" 2>&1; rc=$?
  cp "$L/plan.txt" "$OUT/lease_plan.txt"; cat "$L/plan.txt"
  (( rc == 0 )) || { echo "no group fits the lease's time left: the GPU tests and the benchmark are its answer"; exit 4; }
  read -r epochs est < <(tail -1 "$L/plan.txt")
  flags+=(--set "epochs=$epochs")
  if [[ $REHEARSAL == 1 ]]; then   # the plan above is the lease's; the sweep that runs is CPU-sized
    flags=("${REHEARSAL_SWEEP[@]}" --set epochs=1)
    est=600 left=3600
  fi
  setsid nohup "$PY" sweep.py --space $SPACE --results-dir "$L/results" --no-dashboard "${flags[@]}" \
      --deadline "$(minutes "$left")" --deadline-estimate "$est" > "$L/sweep.log" 2>&1 < /dev/null &
  echo $! > "$L/sweep.pid"
  while sweep_running && (( $(since_t0) < end - COLLECT_S )); do sleep 5; done
  collect "$end"; tail -15 "$L/sweep.log"; echo "study call done at t0+$(since_t0) s (its end: t0+$end s)"
  ;;
receive)
  keep_t0
  end=$(call_end)
  take_parts "$end" || exit 3
  if [[ -f $PACK/site.tar.xz && ! -f $L/site/.unpacked ]]; then   # call 1 carries .lease too
    ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
    record_image "$end"
  fi
  echo "receive done at t0+$(since_t0) s"
  ;;
longseq)
  # issue 60, item 5: the data-free long-sequence bench (search_spaces/token_scaling_gpu.yaml: 55 rows, N = 64 to
  # 16,384 tokens) until the call's end; rows come back as the main job's do, for
  # `analysis/token_scaling.py FOLDER --write-crossover` (luo_crossover.json's cuda entry). No data carried.
  shift
  keep_t0
  end=$(call_end)
  ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
  (( end - COLLECT_S - GRACE_S - $(since_t0) > 60 )) || {
    echo "lease: no time left for the long-sequence bench (its end: t0+$end s)"; exit 124; }
  # no --deadline: a bench row is seconds, not epochs; SIGTERM at the part's end stops the sweep, and every row
  # it finished comes back (collect reads the parts too)
  echo "lease: sweep.py --space $LONGSEQ_SPACE $* until t0+$(( end - COLLECT_S )) s, from t0+$(since_t0) s"
  capped $(( end - COLLECT_S )) TERM "$GRACE_S" "$PY" sweep.py --space $LONGSEQ_SPACE --results-dir "$L/results" \
      --no-dashboard "$@" > "$L/sweep.log" 2>&1
  rc=$?
  collect "$end" token_scaling_gpu
  grep -v -i warn "$L/sweep.log" 2> /dev/null | tail -25; ls -la "$OUT"
  echo "longseq call done at t0+$(since_t0) s (its end: t0+$end s)"
  exit $rc
  ;;
rung)
  shift
  check_rung_args "$@" || exit 2
  epochs=$1; shift
  keep_t0
  end=$(call_end)
  take_parts "$end" --require-complete
  rc=$?
  (( rc == 0 )) || { echo "error: rung $epochs: cifar10.npz is not rebuilt on this machine (the line above says" \
      "which parts are missing or bad); carry them (gpu_lease.sh cifar-plan)" >&2; exit 3; }
  ensure_site $(( $(since_t0) + UNPACK_S )) || exit 3
  seed_declaration
  run_rung $(( end - COLLECT_S )) "$epochs" "$@"
  rc=$?
  collect "$end" "$RUNG_NAME"
  grep -v -i warn "$L/sweep.log" 2> /dev/null | tail -25; ls -la "$OUT"
  echo "rung call done at t0+$(since_t0) s (its end: t0+$end s)"
  exit $rc
  ;;
finish)
  keep_t0
  end=$(call_end)
  while sweep_running && (( $(since_t0) < end - COLLECT_S )); do sleep 5; done
  sweep_running && echo "the sweep is still running at t0+$(since_t0) s: rows so far come back"
  collect "$end"; tail -30 "$L/sweep.log" 2> /dev/null; ls -la "$OUT"
  ;;
esac
