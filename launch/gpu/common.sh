# shellcheck shell=bash disable=SC2034
# Shared helpers of launch/gpu/*. Sourced, never run. (SC2034: variables are read by the
# scripts that source this file.)
#
# Settings (flags win over the environment):
#   --config=configs/X.py   CONFIG    run config (required)
#   --workdir=DIR           WORKDIR   checkpoints, metrics, env files (required); on several
#                                     nodes it must be shared by all of them (NFS, Lustre, gs://)
#   --model-path=DIR        MODEL_PATH  local HF checkpoint directory -> --config.model.source
#   --python=PY             SPADE_PYTHON  interpreter with spade_jax[cuda] (default: python)
#   --mem-fraction=F        XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.90; JAX's own is 0.75)
#   --dry-run               DRY_RUN=1   print the command instead of running it
# Arguments after `--` (and any --config.a.b=v) go to launch/train.py as they are.

# shellcheck source=launch/shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_lib.sh"

CONFIG="${CONFIG:-}"
WORKDIR="${WORKDIR:-}"
MODEL_PATH="${MODEL_PATH:-}"
SPADE_PYTHON="${SPADE_PYTHON:-python}"
XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
EXTRA_ARGS=()
TRAIN_ARGS=()

# Parse the settings above out of "$@"; unknown flags land in EXTRA_ARGS for the script.
parse_gpu_args() {
  EXTRA_ARGS=()
  TRAIN_ARGS=()
  while (($#)); do
    case "$1" in
      --config=*) CONFIG="${1#*=}" ;;
      --config.*=*) TRAIN_ARGS+=("$1") ;;
      --workdir=*) WORKDIR="${1#*=}" ;;
      --model-path=*) MODEL_PATH="${1#*=}" ;;
      --python=*) SPADE_PYTHON="${1#*=}" ;;
      --mem-fraction=*) XLA_PYTHON_CLIENT_MEM_FRACTION="${1#*=}" ;;
      --dry-run) DRY_RUN=1 ;;
      --config | --workdir | --model-path | --python | --mem-fraction) die "write $1=VALUE (with '=')" ;;
      -h | --help)
        usage
        exit 0
        ;;
      --)
        shift
        TRAIN_ARGS+=("$@")
        break
        ;;
      *) EXTRA_ARGS+=("$1") ;;
    esac
    shift
  done
}

# Check the settings and build TRAIN_CMD (the launch/train.py command line) from them.
build_train_cmd() {
  local repo="$1"
  [[ -n "$CONFIG" ]] || die "CONFIG is not set: pass --config=configs/X.py or export CONFIG=..."
  [[ -n "$WORKDIR" ]] || die "WORKDIR is not set: pass --workdir=DIR or export WORKDIR=..."
  local config_file="${CONFIG%%:*}"
  [[ "$config_file" == /* ]] || config_file="$repo/$config_file"
  [[ -f "$config_file" ]] || die "CONFIG=$CONFIG: no such file (paths are relative to $repo)"
  [[ "$XLA_PYTHON_CLIENT_MEM_FRACTION" =~ ^0?\.[0-9]+$|^1(\.0*)?$ ]] ||
    die "XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION: use a fraction like 0.9"
  TRAIN_CMD=("$SPADE_PYTHON" launch/train.py "--config=$CONFIG" "--workdir=$WORKDIR")
  [[ -z "$MODEL_PATH" ]] || TRAIN_CMD+=("--config.model.source=$MODEL_PATH")
  TRAIN_CMD+=("${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}")
}

# Environment of every training process: JAX preallocates this share of each GPU's memory.
export_gpu_env() {
  export XLA_PYTHON_CLIENT_MEM_FRACTION
  export PYTHONUNBUFFERED=1
}
