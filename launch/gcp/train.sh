#!/usr/bin/env bash
# Start launch/train.py on every worker of a TPU VM slice (in the background, with a log file).
#
#   bash launch/gcp/train.sh --project=P --zone=Z --bucket=gs://B --tpu=NAME \
#       --config=configs/30b.py [--run=NAME | --workdir=gs://B/runs/NAME] \
#       [--model=gs://B/models/Qwen3-30B-A3B-Instruct-2507 | --model-path=/local/dir] \
#       [--env=KEY=VALUE ...] [--kill-existing] [--stop] [--dry-run] \
#       [-- --config.total_cycles=100 --noresume ...]
#
# Every worker runs the same command (JAX multi-controller; spade_jax joins jax.distributed
# from the TPU environment). The workdir must be on gs:// so that all workers share it; it
# defaults to $BUCKET/runs/<run>, with <run> = <config name>-<UTC time>. Reuse --run (or
# --workdir) to resume a run from its newest checkpoint. --model copies a gs:// HF checkpoint
# to local disk on each worker (skipped when already there) and passes
# --config.model.source=<local copy>; --model-path passes a directory already on the workers.
# Logs: ~/spade_logs/<run>.log on each worker (latest.log points at the newest); follow them
# with launch/gcp/logs.sh. --kill-existing stops a run still going on the slice first;
# --stop only stops it. Arguments after `--` go to launch/train.py as they are.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
CONFIG=""
RUN_NAME=""
WORKDIR=""
MODEL=""
MODEL_PATH=""
KILL_EXISTING=0
STOP=0
ENVS=(PYTHONUNBUFFERED=1)
OVERRIDES=()
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --config=*) CONFIG="${arg#*=}" ;;
    --config.*=*) OVERRIDES+=("$arg") ;;
    --run=*) RUN_NAME="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --model=*) MODEL="${arg#*=}" ;;
    --model-path=*) MODEL_PATH="${arg#*=}" ;;
    --env=*=*) ENVS+=("${arg#--env=}") ;;
    --kill-existing) KILL_EXISTING=1 ;;
    --stop) STOP=1 ;;
    *) die "unknown argument '$arg' (arguments for launch/train.py go after --)" ;;
  esac
done
OVERRIDES+=("${PASSTHROUGH_ARGS[@]+"${PASSTHROUGH_ARGS[@]}"}")
require_common

LOGS="\$HOME/$REMOTE_LOGS"
PIDFILE="$LOGS/train.pid"
# Stop the run this script started last on the worker (its pid file), and wait for it to go,
# so that the TPU is free again. ($ expands on the worker: single quotes are meant.)
# shellcheck disable=SC2016
stop_cmd='if [ -f '"$PIDFILE"' ] && kill -0 "$(cat '"$PIDFILE"')" 2>/dev/null; then pid="$(cat '"$PIDFILE"')"; echo "$(hostname): stopping pid $pid"; kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"; for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done; kill -KILL -- "-$pid" 2>/dev/null || true; fi'

if [[ "$STOP" == 1 ]]; then
  ssh_all all "$stop_cmd"
  exit 0
fi

require CONFIG
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config_file="${CONFIG%%:*}"
[[ "$config_file" != /* ]] || die "CONFIG must be a path inside the repository, e.g. configs/30b.py"
[[ -f "$REPO_ROOT/$config_file" ]] || die "CONFIG=$CONFIG: no such file in $REPO_ROOT"
if [[ -z "$WORKDIR" ]]; then
  if [[ -z "$RUN_NAME" ]]; then
    name="$(basename "$config_file" .py)"
    RUN_NAME="$name-$(date -u +%Y%m%d-%H%M%S)"
  fi
  WORKDIR="$BUCKET/runs/$RUN_NAME"
fi
[[ "$WORKDIR" == gs://* ]] || die "WORKDIR must be a gs:// URL shared by all workers, got '$WORKDIR'"
RUN_NAME="${RUN_NAME:-$(basename "$WORKDIR")}"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--run=$RUN_NAME: use letters, digits, '.', '_' or '-'"
[[ -z "$MODEL" || -z "$MODEL_PATH" ]] || die "pass --model=gs://... or --model-path=DIR, not both"

train=(launch/train.py "--config=$CONFIG" "--workdir=$WORKDIR")
steps=("set -e" "mkdir -p $LOGS" "cd \$HOME/$REMOTE_REPO")
if [[ -n "$MODEL" ]]; then
  steps+=("$(remote_model_copy "$MODEL")")
  train+=("--config.model.source=$(remote_model_path "$MODEL")")
elif [[ -n "$MODEL_PATH" ]]; then
  train+=("--config.model.source=$MODEL_PATH")
fi
train+=("${OVERRIDES[@]+"${OVERRIDES[@]}"}")

if [[ "$KILL_EXISTING" == 1 ]]; then
  steps+=("$stop_cmd")
else
  # shellcheck disable=SC2016
  steps+=('if [ -f '"$PIDFILE"' ] && kill -0 "$(cat '"$PIDFILE"')" 2>/dev/null; then echo "$(hostname): a run is still going (pid $(cat '"$PIDFILE"')); pass --kill-existing or --stop" >&2; exit 1; fi')
fi
log="$LOGS/$RUN_NAME.log"
steps+=(
  "setsid nohup env $(quote_words "${ENVS[@]}") \$HOME/$REMOTE_VENV/bin/python $(quote_words "${train[@]}") > $log 2>&1 < /dev/null & echo \$! > $PIDFILE"
  "ln -sfn $RUN_NAME.log $LOGS/latest.log"
  "echo \"\$(hostname): started pid \$(cat $PIDFILE), log $log\""
)
remote="$(printf '%s; ' "${steps[@]}")"
ssh_all all "${remote%; }"
echo "run $RUN_NAME, workdir $WORKDIR; follow it with: bash launch/gcp/logs.sh --tpu=$TPU_NAME" >&2
