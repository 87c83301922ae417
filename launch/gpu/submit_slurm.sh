#!/usr/bin/env bash
# Submit launch/gpu/train_slurm.sbatch: multi-node GPU training, one process per node.
#
#   bash launch/gpu/submit_slurm.sh --nodes=4 [--gpus-per-node=8] [--partition=P] \
#       [--account=A] [--time=24:00:00] [--job-name=spade_jax] \
#       --config=configs/32b_dense.py --workdir=/shared/runs/32b [--model-path=/data/Qwen3-32B] \
#       [--dry-run] [-- --config.total_cycles=100 ...]
#
# The workdir and the model directory must be on storage every node sees. Logs go to
# <workdir>/slurm-<job id>.out when the workdir is a local path, else ./spade_jax-<job id>.out.
# --dry-run prints the sbatch command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_gpu_args "$@"
NODES=""
GPUS_PER_NODE=8
SBATCH_FLAGS=()
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --nodes=*) NODES="${arg#*=}" ;;
    --gpus-per-node=*) GPUS_PER_NODE="${arg#*=}" ;;
    --partition=* | --account=* | --time=* | --job-name=* | --qos=* | --constraint=* | \
      --reservation=* | --cpus-per-task=*)
      SBATCH_FLAGS+=("$arg") ;;
    *) die "unknown argument '$arg' (arguments for launch/train.py go after --)" ;;
  esac
done
[[ -n "$NODES" ]] || die "NODES is not set: pass --nodes=N (one process per node)"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes=$NODES must be a positive number"
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node=$GPUS_PER_NODE must be a positive number"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_train_cmd "$REPO_ROOT"   # validates CONFIG and WORKDIR before anything is queued
cd "$REPO_ROOT"                 # relative workdirs are relative to the repository, as in the job

output="spade_jax-%j.out"
if [[ "$WORKDIR" != *://* ]]; then
  [[ "${DRY_RUN:-0}" == 1 ]] || mkdir -p "$WORKDIR"
  output="$WORKDIR/slurm-%j.out"
fi
script_args=("--config=$CONFIG" "--workdir=$WORKDIR" "--mem-fraction=$XLA_PYTHON_CLIENT_MEM_FRACTION"
  "--python=$SPADE_PYTHON")
[[ -z "$MODEL_PATH" ]] || script_args+=("--model-path=$MODEL_PATH")
script_args+=(-- "${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}")
cmd=(sbatch "--nodes=$NODES" --ntasks-per-node=1 "--gpus-per-node=$GPUS_PER_NODE"
  "--chdir=$REPO_ROOT" "--output=$output" "--export=ALL,SPADE_REPO=$REPO_ROOT"
  "${SBATCH_FLAGS[@]+"${SBATCH_FLAGS[@]}"}" "$REPO_ROOT/launch/gpu/train_slurm.sbatch" "${script_args[@]}")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  quote_words "${cmd[@]}"
  printf '\n'
  exit 0
fi
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a SLURM login node (or use --dry-run)"
"${cmd[@]}"
