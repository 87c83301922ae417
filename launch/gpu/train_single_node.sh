#!/usr/bin/env bash
# Train on one GPU machine: one process that owns all of its GPUs (JAX's model on GPUs).
#
#   bash launch/gpu/train_single_node.sh --config=configs/8b.py --workdir=runs/8b \
#       [--model-path=/data/Qwen3-8B] [--gpus=0,1,2,3] [--mem-fraction=0.9] \
#       [--python=.venv/bin/python] [--dry-run] [-- --config.total_cycles=100 ...]
#
# Install first: pip install -e ".[cuda]" (jax[cuda12]) and apt-get install -y bubblewrap.
# --gpus sets CUDA_VISIBLE_DEVICES (default: every GPU). The mesh (configs' mesh.fsdp=-1)
# fills from the visible GPUs. Runs in the foreground; use tmux or nohup for long runs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_gpu_args "$@"
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --gpus=*)
      [[ "${arg#*=}" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus=${arg#*=}: use a list like 0,1,2,3"
      export CUDA_VISIBLE_DEVICES="${arg#*=}"
      ;;
    *) die "unknown argument '$arg' (arguments for launch/train.py go after --)" ;;
  esac
done
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_train_cmd "$REPO_ROOT"
export_gpu_env
# One host: never join a distributed run by accident (SLURM_NTASKS > 1 inside an allocation
# would make spade_jax wait for processes that never start).
unset SPADE_COORDINATOR SPADE_NUM_PROCESSES SPADE_PROCESS_ID SLURM_NTASKS

env_words=("XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION")
[[ -z "${CUDA_VISIBLE_DEVICES:-}" ]] || env_words+=("CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  echo "cd $(shell_quote "$REPO_ROOT") && $(quote_words env "${env_words[@]}" "${TRAIN_CMD[@]}")"
  exit 0
fi
cd "$REPO_ROOT"
echo "+ $(quote_words env "${env_words[@]}" "${TRAIN_CMD[@]}")" >&2
exec "${TRAIN_CMD[@]}"
