#!/usr/bin/env bash
# One GPU lease of LEASE_BUDGET_S seconds (default 1800; below; the device tool: each call <= 10 min, the next within 30 s of the last, or the
# machine and everything on it is gone), in three calls that return a measured answer:
#
# Here, once (needs PyPI and DATA_DIR/mnist.npz):   benchmarks/gpu_lease.sh prepare DATA_DIR
#   packs the wheels of benchmarks/lease/wheels.txt, installed into one folder (ray without ray/jars),
#   as .lease/site.tar.xz, with mnist.npz and their SHA-256 (~45 MB: one call carries 64 MiB).
# Rehearse it on this CPU first:                    benchmarks/gpu_rehearsal.sh
# Then, back to back, each with timeout_s 600 (files come back from $OUT; t0 is the first call's start):
#   run carry=[.lease]  bash benchmarks/gpu_lease.sh first    unpack, record the image, GPU tests
#                                                             (pytest -m gpu, 6 processes): <= 7.5 min
#   run                 bash benchmarks/gpu_lease.sh study    the throughput benchmark (<= 4.5 min), then the
#                       [SWEEP FLAGS]                         plan (benchmarks/lease/plan.py: whole groups that
#                                                             end by t0 + 25 min), the sweep launched in its own
#                                                             session; waits to the call's 9.6 min, rows back
#   run                 bash benchmarks/gpu_lease.sh finish   wait for the sweep (at most until t0 + 26.5 min),
#                                                             bring back rows, per-epoch curves and a figure
# then give the machine back at once (the 30 minutes count until then, its start included).
# Default SWEEP FLAGS: the MNIST half of all12.yaml (12 fused groups of 3 seeds, 49 tokens, compiled, bf16),
# --only dataset=mnist, at the longest budget (epochs, up to its 30) at which every group fits (plan.py).
# Nothing relies on a checkpoint coming back (a trial's is ~32 MB); the rows and epochs.parquet are the
# result. Every figure names the device.
# LEASE_REHEARSAL=1 (benchmarks/gpu_rehearsal.sh) runs the same steps on a CPU: the GPU tests collect
# and skip, tests/all12_cells.py runs every all12 cell on the CPU instead, the benchmark and the sweep
# are cut to CPU size, and the planner is still asked with the lease's deadline and GPU estimate.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${LEASE_PYTHON:-python3}
L=${LEASE_DIR:-/tmp/lease}
OUT=${OUT:-$L/out}
REHEARSAL=${LEASE_REHEARSAL:-0}
SPACE=search_spaces/all12.yaml
DEFAULT_FLAGS=(--only dataset=mnist)   # the budget (epochs) is the plan's
# LEASE_BUDGET_S: seconds from the first call's start (t0) until the machine goes back. The lease was
# planned for 30 minutes (1800, the default); the device tool now lends 15 minutes per session, its start
# included: read budget_left_s from the tool's status before the first call and pass that minus the start
# (the H100 lease of 2026-11-26 started in under a minute; LEASE_BUDGET_S=640 took 431 s of a 585-s call).
# Every step below scales with it (`gpu_lease.sh budget` prints them).
# Under 25 minutes there is no room for a study beside the tests and the benchmark (a group compiles for
# ~90 s and the plan needs whole groups): the tests and the benchmark get the time (40% each), and the
# study call runs the benchmark with CUDA graphs (`--compile cudagraphs`; profiled: where a step's time goes,
# benchmarks/step_profile.py; the packed processes with and without MPS, `--mps`), and stops (exit 4, saying so). Both fit one call: `first; study`. If time is left, a second call (within the 30 s
# the machine stays warm) runs `gpu_lease.sh group`: one fused all12 group through sweep.py, rows and curves back
# (~150 s on an H100, compile included); then give the machine back.
BUDGET_S=${LEASE_BUDGET_S:-1800}
CALL_S=575                 # a call's own budget (the tool's limit is 600 s)
if (( BUDGET_S >= 1500 )); then
  TESTS_S=420 BENCH_S=270                 # GPU tests <= 7 min, the benchmark <= 4.5 min
  STUDY_END_S=$(( BUDGET_S - 300 ))       # from t0: the sweep's --deadline (the last call collects ~1.5 min)
else
  # tests and benchmark 40% each, each one call (<= 575 s), and 150 s kept for the unpacking and the
  # calls' starts and returns (all inside the lend)
  TESTS_S=$(( BUDGET_S * 40 / 100 )) STUDY_END_S=0
  (( TESTS_S > 420 )) && TESTS_S=420
  BENCH_S=$(( BUDGET_S - TESTS_S - 150 ))
  (( BENCH_S > BUDGET_S * 40 / 100 )) && BENCH_S=$(( BUDGET_S * 40 / 100 ))
  (( BENCH_S > CALL_S )) && BENCH_S=$CALL_S
fi
FINISH_END_S=$(( BUDGET_S - 210 ))

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

[[ "${1:-}" == prepare ]] && { prepare "${2:-}"; exit $?; }
(( BUDGET_S >= 540 )) || { echo "error: LEASE_BUDGET_S=$BUDGET_S leaves no time for the GPU tests and a collection; allowed: >= 540" >&2; exit 2; }
if [[ "${1:-}" == budget ]]; then   # the lease's time plan for LEASE_BUDGET_S, without running anything
  echo "budget_s=$BUDGET_S tests_s=$TESTS_S bench_s=$BENCH_S study_end_s=$STUDY_END_S finish_end_s=$FINISH_END_S"
  exit 0
fi

mkdir -p "$L/site" "$L/results" "$L/data" "$OUT"
export PYTHONPATH=$L/site:$PWD PYTHONUNBUFFERED=1 RPEVIT_DATA=$L/data
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}  # several compiling processes at once
since_t0() { echo $(( $(date +%s) - $(cat "$L/t0") )); }
device_name() {
  "$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (rehearsal)")'
}
collect() {
  local d=$L/results/all12
  for f in trials.parquet epochs.parquet space.json; do [[ -f $d/$f ]] && cp "$d/$f" "$OUT/$f"; done
  [[ -f $L/sweep.log ]] && tail -c 2000000 "$L/sweep.log" > "$OUT/sweep.log"
  [[ -f $d/epochs.parquet ]] && "$PY" benchmarks/lease/curves.py "$d" "$OUT/curves.png" "$(device_name)"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv \
      > "$OUT/smi.txt" 2>&1
  return 0
}
sweep_running() { [[ -f $L/sweep.pid ]] && kill -0 "$(cat "$L/sweep.pid")" 2> /dev/null; }

case "${1:-}" in
first)
  date +%s > "$L/t0"
  (cd .lease && sha256sum -c SHA256SUMS) || exit 3
  xz -dc .lease/site.tar.xz | tar xf - -C "$L/site" || exit 3
  cp .lease/mnist.npz "$L/data/" || exit 3
  { "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
    command -v nvidia-smi > /dev/null && nvidia-smi
    "$PY" -m pip list --format=freeze; } > "$OUT/image.txt" 2>&1
  "$PY" -c 'import ray.tune, sweep, rpevit.sweep.tune_run, tests.test_gpu; print("imports ok")' 2>&1 \
      | tee "$OUT/imports.log" | tail -3
  if [[ $REHEARSAL == 1 ]]; then   # no CUDA: the gpu tests must collect (then skip); the cells run on the CPU
    "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -3
    "$PY" -m tests.all12_cells --device cpu --backend "${REHEARSAL_BACKEND:-inductor}" \
        --json "$OUT/cells.json" 2>&1 | tee "$OUT/cells.log"
  else
    # SIGINT at the limit: pytest stops, prints what ran and writes its XML (SIGTERM would lose both)
    timeout -s INT -k 30 "$TESTS_S" "$PY" -m pytest -q -m gpu tests/test_gpu.py -n 6 -p no:cacheprovider -rfE \
        --junitxml "$OUT/pytest_gpu.xml" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
  fi
  echo "first call done at t0 + $(since_t0) s"
  ;;
study)
  call_start=$(date +%s)
  shift; flags=("$@"); (( ${#flags[@]} )) || flags=("${DEFAULT_FLAGS[@]}")
  if [[ $REHEARSAL == 1 ]]; then
    bench=(--models tiny --fused 3 --packed 2 --samples 3 --steps 1 --warmup 1 --backend aot_eager --profile-steps 1)
  else
    bench=(--models gpu --fused 3 5 --packed 4 --samples 3 --steps 10 --warmup 3 --profile-steps 5)
  fi
  main_s=$BENCH_S
  if (( STUDY_END_S == 0 )); then
    # a short lease: the compiled modes with CUDA graphs, every fused size and the packed layout with and
    # without MPS, in all of BENCH_S (the H100 lease of 2026-11-26 measured `on` beside eager and CUDA graphs:
    # the step is launch-bound, `on` no faster than eager, CUDA graphs several times faster)
    cg=("${bench[@]}" --compile cudagraphs --mps)   # --mps: the packed processes again under MPS
    [[ $REHEARSAL == 1 ]] && cg=("${bench[@]}")   # no CUDA: the script's path, not CUDA graphs or MPS
    timeout "$main_s" "$PY" benchmarks/throughput.py "${cg[@]}" --json "$OUT/throughput_cudagraphs.json" 2>&1 \
        | grep -v Warning | tee "$OUT/throughput_cudagraphs.log"
    echo "no study in a lease of $BUDGET_S s (under 1500): the GPU tests and the benchmark are its answer; a second"
    echo "call within 30 s may run one fused group through the sweep (gpu_lease.sh group), else give the machine back"
    exit 4
  fi
  timeout "$main_s" "$PY" benchmarks/throughput.py "${bench[@]}" --json "$OUT/throughput.json" 2>&1 \
      | grep -v Warning | tee "$OUT/throughput.log"
  cp "$OUT/throughput.json" "$L/throughput.json" 2> /dev/null
  left=$(( STUDY_END_S - $(since_t0) ))
  [[ $REHEARSAL == 1 ]] && left=$(( STUDY_END_S - 720 ))   # the lease's: its plan is made ~12 min in
  "$PY" benchmarks/lease/plan.py --deadline-s "$left" --throughput "$L/throughput.json" "${flags[@]}" \
      > "$L/plan.txt" 2>&1; rc=$?
  cp "$L/plan.txt" "$OUT/lease_plan.txt"; cat "$L/plan.txt"
  (( rc == 0 )) || { echo "no group fits the lease's time left: the GPU tests and the benchmark are its answer"; exit 4; }
  read -r epochs est < <(tail -1 "$L/plan.txt")
  flags+=(--set "epochs=$epochs")
  if [[ $REHEARSAL == 1 ]]; then   # the plan above is the lease's; the sweep that runs is CPU-sized
    flags=(--only dataset=mnist --only attention=softmax --only pe=luo_rpe --set epochs=1 --set train_subset=384
           --set device=cpu --gpus-per-trial 0 --cpus-per-trial 1)
    est=600 left=3600
  fi
  setsid nohup "$PY" sweep.py --space $SPACE --results-dir "$L/results" --no-dashboard "${flags[@]}" \
      --deadline "$(( left / 60 ))m" --deadline-estimate "$est" > "$L/sweep.log" 2>&1 < /dev/null &
  echo $! > "$L/sweep.pid"
  end=$(( call_start + ${LEASE_WAIT_S:-$CALL_S} ))
  while sweep_running && (( $(date +%s) < end )); do sleep 10; done
  collect; tail -15 "$L/sweep.log"; echo "study call done at t0 + $(since_t0) s"
  ;;
group)
  # one fused group of all12.yaml through sweep.py and Ray Tune, end to end (rows, per-epoch curves, a figure
  # naming the device): by default MNIST favor + luo_rpe, 3 seeds, 2 epochs (a fixed budget, not a study
  # result), compiled as all12.yaml says; extra flags (e.g. --set compile=cudagraphs) go to the sweep
  shift; flags=("$@")
  run=(--only dataset=mnist --only attention=favor --only pe=luo_rpe --set epochs=2)
  [[ $REHEARSAL == 1 ]] && run=(--only dataset=mnist --only attention=favor --only pe=luo_rpe --set epochs=1
                                --set train_subset=384 --set device=cpu --gpus-per-trial 0 --cpus-per-trial 1)
  timeout "${LEASE_GROUP_S:-300}" "$PY" sweep.py --space $SPACE --results-dir "$L/results" --no-dashboard \
      "${run[@]}" "${flags[@]}" > "$L/sweep.log" 2>&1
  rc=$?
  collect; grep -v -i warn "$L/sweep.log" | tail -25; ls -la "$OUT"
  exit $rc
  ;;
finish)
  end=$(( $(cat "$L/t0") + FINISH_END_S ))
  while sweep_running && (( $(date +%s) < end )); do sleep 10; done
  sweep_running && echo "the sweep is still running at t0 + $(since_t0) s: rows so far come back"
  collect; tail -30 "$L/sweep.log"; ls -la "$OUT"
  ;;
*) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
