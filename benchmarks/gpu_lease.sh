#!/usr/bin/env bash
# One 30-minute GPU lease of the project's device tool, in stages: issue 26's throughput figures,
# then issue 27's converged CIFAR-10 study under --deadline, with the gpu tests beside it.
# Not yet run on a device (no session since it was written has been lent one).
#
# Here, once:   benchmarks/gpu_lease.sh prepare ../shared/data
#   puts the wheels the device lacks (Ray, fvcore and their missing needs) and cifar10.npz, tarred
#   and split into parts of 55 MiB, in .device_data/ (git-ignored; a call carries 64 MiB at most).
# Then, back to back (a warm device is given back after 30 s idle; everything lives in /tmp/lease):
#   run carry=[.device_data/small, .device_data/blob.00]  bash benchmarks/gpu_lease.sh stage1
#   run carry=[.device_data/blob.0N]                      bash benchmarks/gpu_lease.sh stash   (N = 1..3)
#   run carry=[.device_data/blob.04]                      bash benchmarks/gpu_lease.sh launch [SWEEP FLAGS]
#   run                                                   bash benchmarks/gpu_lease.sh wait 570  (repeat)
# stage1 times the throughput modes alone (throughput_gpu_k5.json / _k12.json under $OUT); launch
# reassembles the parts, checks their SHA-256, installs Ray, starts the study sweep in its own
# session (it outlives the call) with --deadline at 25 minutes after stage1 began and a per-epoch
# estimate from stage1's solo compiled rate, then runs the gpu tests beside it (behaviour only);
# wait brings back trials.parquet, epochs.parquet, space.json and the sweep's log.
# Default SWEEP FLAGS: --only pe=ape --only seed=0 (the budget curves of issue 27, item 2).
set -uo pipefail
L=/tmp/lease
SPACE=search_spaces/cifar10_converged_gpu.yaml
PARTS_MIB=55

prepare() {
  local data=${1:?prepare needs the folder holding cifar10.npz}
  local py=python3; [[ -x .venv/bin/python ]] && py=.venv/bin/python
  local ray_version; ray_version=$("$py" -c 'import ray; print(ray.__version__)') || exit 1
  rm -rf .device_data && mkdir -p .device_data/small .device_data/stage || exit 1
  local pick=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
              --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  "$py" -m pip download -q "${pick[@]}" -d .device_data/small jsonschema jsonschema-specifications referencing \
      rpds-py tensorboardX || exit 1
  "$py" -m pip download -q "${pick[@]}" -d .device_data/stage "ray==$ray_version" || exit 1
  "$py" -m pip wheel -q --no-deps -w .device_data/small fvcore iopath yacs termcolor || exit 1
  cp "$data/cifar10.npz" .device_data/stage/ || exit 1
  (cd .device_data/stage && sha256sum ./* | sed 's#\./##') > .device_data/small/SHA256
  tar cf - -C .device_data/stage . | split -b ${PARTS_MIB}M -d - .device_data/blob.
  rm -rf .device_data/stage
  ls -la .device_data .device_data/small
}

[[ "${1:-}" == prepare ]] && { prepare "${2:-}"; exit $?; }

mkdir -p $L/site $L/results
export PYTHONPATH=$L/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stash() { for f in .device_data/blob.*; do [[ -f $f ]] && cp "$f" $L/; done; ls -la $L | grep blob; }
collect() {
  local d=$L/results/cifar10_converged_gpu
  for f in trials.parquet epochs.parquet space.json; do [[ -f $d/$f ]] && cp $d/$f "$OUT/$f"; done
  [[ -f $L/sweep.log ]] && tail -c 200000 $L/sweep.log > "$OUT/sweep.log"
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv > "$OUT/smi.txt" 2>&1
}
case "${1:-}" in
stage1)
  date +%s > $L/t0; stash
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $L/site \
      .device_data/small/*.whl || exit 3
  nvidia-smi | tee "$OUT/nvidia_smi.txt"
  python3 -c 'import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)'
  timeout 330 python3 benchmarks/throughput.py --models gpu --fused 5 --packed 4 --steps 20 --warmup 5 \
      --json "$OUT/throughput_gpu_k5.json" 2>&1 | tee "$OUT/throughput_k5.log" | grep -v Warning
  cp "$OUT/throughput_gpu_k5.json" $L/k5.json
  timeout 200 python3 benchmarks/throughput.py --models gpu --fused 12 --packed 0 --steps 20 --warmup 5 \
      --json "$OUT/throughput_gpu_k12.json" 2>&1 | tee "$OUT/throughput_k12.log" | grep -v Warning
  ;;
stash) stash ;;
launch)
  shift; flags=("$@"); (( ${#flags[@]} )) || flags=(--only pe=ape --only seed=0)
  stash; mkdir -p $L/data
  cat $L/blob.* | tar xf - -C $L/data || exit 4
  (cd $L/data && sha256sum -c "$OLDPWD/.device_data/small/SHA256") || exit 5
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $L/site \
      $L/data/ray-*.whl || exit 6
  # seconds per epoch of one trial: 45,000 images at the solo compiled rate, slowed by the measured
  # packing efficiency (trials share the GPU), x 1.25 for the tests beside it, + 2 s of validation
  est=$(python3 -c '
import json
try:
    r = {x["mode"]: x for x in json.load(open("/tmp/lease/k5.json"))["models"]["gpu"]["rows"]}
    solo = r["solo compiled (on)"]["images_per_s"]
    eff = min(1.0, r["4 packed processes"]["images_per_s"] / (4 * r["solo eager"]["images_per_s"]))
    print(round(1.25 * 45000 / (solo * eff) + 2.0, 2))
except Exception:
    print(10.0)')
  t0=$(cat $L/t0); now=$(date +%s); mins=$(( (t0 + 1500 - now) / 60 ))
  echo "deadline estimate ${est} s/epoch; deadline ${mins}m from now; flags ${flags[*]}"
  setsid nohup python3 sweep.py --space $SPACE --data-dir $L/data --results-dir $L/results --no-dashboard \
      "${flags[@]}" --deadline ${mins}m --deadline-estimate "$est" > $L/sweep.log 2>&1 < /dev/null &
  sleep 45; tail -20 $L/sweep.log
  timeout 330 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
  collect; tail -5 $L/sweep.log
  ;;
wait)
  end=$(( $(date +%s) + ${2:-570} ))
  while pgrep -f "sweep.py --space" > /dev/null && (( $(date +%s) < end )); do sleep 10; done
  collect; tail -30 $L/sweep.log; ls -la "$OUT"
  ;;
*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
