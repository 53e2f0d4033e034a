#!/bin/bash
# An rpevit sweep on a SLURM allocation: Ray on every node through Ray's documented `ray symmetric-run`
# (Ray >= 2.49: starts the head on the first node and a worker on each other node, runs the sweep driver
# on the head only, stops Ray afterwards), with a --deadline inside the job's --time. From the checkout,
# which must lie on storage every node sees (as RESULTS must):
#   sbatch docs/cluster/slurm_sweep.sh
#   SPACE=search_spaces/all12.yaml DATA=/shared/data RESULTS=/shared/results sbatch docs/cluster/slurm_sweep.sh
# Submitting it again continues the sweep where the last job stopped (--resume); docs/cluster.md.
#SBATCH --job-name=rpevit-sweep
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --cpus-per-task=16
#SBATCH --gpus-per-task=1
#SBATCH --time=04:00:00
#SBATCH --output=rpevit-sweep-%j.out
set -euo pipefail

SPACE=${SPACE:-search_spaces/all12.yaml}
RESULTS=${RESULTS:-$PWD/results}   # shared storage: every node writes trial checkpoints and logs there
DATA=${DATA:-}                     # folder of <dataset>.npz, the same path on every node ('' for digits)
MARGIN_MIN=${MARGIN_MIN:-20}       # start no trial predicted to end later than this before the job's end
PORT=${PORT:-6379}                 # the Ray head's GCS port on the first node
PYTHON=${PYTHON:-python}           # the interpreter rpevit is installed in, on every node
# Load the environment every node runs in here, e.g.: module load cuda; source "$PWD/.venv/bin/activate"

# the first hostname; sed reads the whole list (head -n 1 exits early, and under pipefail the SIGPIPE that
# scontrol then gets on a long node list ended the job here with status 141)
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
address="$head_node:$PORT"

# The job's end (local time, e.g. 2026-11-23T18:00:00) minus the margin: the sweep starts only the
# trials its estimates say end before it, lets them finish, and prints the command that continues.
deadline=()
end=$(squeue --noheader --jobs "$SLURM_JOB_ID" --format=%e)
if [[ "$end" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]+$ ]]; then
  deadline=(--deadline "$(date --date "${end/T/ } $MARGIN_MIN minutes ago" +%Y-%m-%dT%H:%M)")
fi
# GPUs per node, for Ray: --gpus-per-task sets SLURM_GPUS_PER_TASK; --gres=gpu:N and --gpus-per-node set only
# SLURM_GPUS_ON_NODE (Ray told 0 GPUs there would leave every GPU trial waiting until the job's end); either may
# name a type (a100:1). GPUS=N, given to sbatch's environment, overrides both.
gpus=${GPUS:-${SLURM_GPUS_PER_TASK:-${SLURM_GPUS_ON_NODE:-0}}}
gpus=${gpus##*:}
if [[ ! "$gpus" =~ ^[0-9]+$ ]]; then
  echo "error: GPUs per node has value '$gpus' (from GPUS, SLURM_GPUS_PER_TASK or SLURM_GPUS_ON_NODE); allowed:" \
       "a whole number (GPUS=4 sbatch docs/cluster/slurm_sweep.sh)" >&2
  exit 2
fi
data=()
if [[ -n "$DATA" ]]; then
  data=(--data-dir "$DATA")
fi
# Ray's token auth (docs/cluster.md, "Token auth"): `ray start --head` turns it on whenever a token exists
# (~/.ray/auth_token: every local sweep writes one), a worker's `ray start --address` never does by itself,
# so every node would have to agree by chance. Here it is on everywhere, with one token: the one of this user
# (made once, readable by you alone, where none exists), exported to every srun task.
token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
if [[ -z "${RAY_AUTH_TOKEN:-}" && ! -s "$token_file" ]]; then
  (umask 077 && mkdir -p "$(dirname "$token_file")" && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$token_file")
fi
RAY_AUTH_TOKEN=${RAY_AUTH_TOKEN:-$(<"$token_file")}
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN
echo "ray head at $address on $SLURM_JOB_NUM_NODES node(s), $gpus GPU(s) each; job ends ${end:-?}; ${deadline[*]:-no deadline}"

srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
  ray symmetric-run --address "$address" --min-nodes "$SLURM_JOB_NUM_NODES" \
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="$gpus" \
  -- "$PYTHON" -u sweep.py --space "$SPACE" --address "$address" --results-dir "$RESULTS" "${data[@]}" \
    --max-failures 3 --resume "${deadline[@]}"
