#!/usr/bin/env bash
# One-command GPU check: the `gpu` tests, MNIST s/epoch and images/s on the GPU, and the aggregate
# images/s of 4 trials packed on one GPU vs 1 trial alone.
#
#   benchmarks/gpu_check.sh [DATA_DIR] [--out DIR] [--pack N] [--train-subset N] [--threads N]
#                           [--skip-tests] [--device cuda|cpu] [-- EXTRA TRAIN FLAGS]
#
# DATA_DIR holds mnist.npz (default: $RPEVIT_DATA). EXTRA TRAIN FLAGS go to every
# `python -m rpevit.cli` (e.g. `-- --attention favor --pe rope`); the default trial is the CLI's.
# --device cpu is for a dry run of this script on a machine without a GPU (the tests then skip);
# the figures only mean something on cuda. Exits non-zero if the tests fail, after the figures.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python
fi

data_dir="${RPEVIT_DATA:-}"
out=""
pack=4
subset=0
threads=0
device=cuda
run_tests=1
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --pack) pack="$2"; shift 2 ;;
        --train-subset) subset="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        --skip-tests) run_tests=0; shift ;;
        -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) data_dir="$1"; shift ;;
    esac
done

if [[ -z "$data_dir" || ! -f "$data_dir/mnist.npz" ]]; then
    echo "error: no mnist.npz in '${data_dir}'; pass DATA_DIR or set \$RPEVIT_DATA" >&2
    exit 2
fi
data_dir="$(cd "$data_dir" && pwd)"
if [[ "$device" != cuda && "$device" != cpu ]]; then
    echo "error: --device $device; allowed: cuda, cpu" >&2
    exit 2
fi
if [[ "$device" == cuda ]] && ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "error: torch sees no CUDA device here; for a dry run of this script pass --device cpu" >&2
    exit 2
fi
out="${out:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}"
mkdir -p "$out"
if [[ "$threads" == 0 ]]; then
    threads=$(( $(nproc) / pack ))
    (( threads >= 1 )) || threads=1
fi
subset_flags=()
if [[ "$subset" != 0 ]]; then
    subset_flags=(--train-subset "$subset")
fi
echo "== gpu_check: device $device, data $data_dir, output in $out"
"$py" -c 'import torch; print("torch", torch.__version__, "| cuda", torch.version.cuda, "|",
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'

# (a) the gpu-marked tests
tests_rc=0
if [[ "$run_tests" == 1 ]]; then
    echo "== (a) pytest -m gpu tests/test_gpu.py"
    "$py" -m pytest -q -m gpu tests/test_gpu.py || tests_rc=$?
fi

# (b) one MNIST epoch alone: s/epoch and images/s from the summary row
echo "== (b) MNIST, 1 epoch, --amp bf16, one trial"
OMP_NUM_THREADS="$threads" "$py" -m rpevit.cli --quiet --dataset mnist --data-dir "$data_dir" --epochs 1 \
    --device "$device" --amp bf16 ${subset_flags[@]+"${subset_flags[@]}"} ${extra[@]+"${extra[@]}"} >"$out/single.json"
"$py" benchmarks/gpu_packing.py --show-row "$out/single.json"

# (c) packing: 1 trial alone, then $pack at once on the same GPU (each capped at 1/$pack of its memory)
echo "== (c) ${pack}-per-GPU vs 1-per-GPU aggregate images/s"
"$py" benchmarks/gpu_packing.py --data-dir "$data_dir" --device "$device" --pack "$pack" \
    --train-subset "$subset" --threads "$threads" --out "$out/packing.json" -- ${extra[@]+"${extra[@]}"}

if [[ "$tests_rc" != 0 ]]; then
    echo "== gpu tests FAILED (pytest exit $tests_rc); figures above, files in $out" >&2
else
    echo "== done; files in $out"
fi
exit "$tests_rc"
