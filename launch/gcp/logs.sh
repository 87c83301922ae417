#!/usr/bin/env bash
# Follow the training log of a TPU VM slice: worker 0 (default), one worker, or all of them.
#
#   bash launch/gcp/logs.sh --project=P --zone=Z --bucket=gs://B --tpu=NAME \
#       [--worker=0|N|all] [--run=NAME] [--lines=100] [--no-follow] [--dry-run]
#
# Reads ~/spade_logs/<run>.log (default: latest.log, the run train.sh started last). With
# --worker=all every line is prefixed with the worker's hostname. Ctrl-C stops following; the
# training keeps running.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
WORKER=0
RUN_NAME="latest"
LINES=100
FOLLOW=1
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --worker=*) WORKER="${arg#*=}" ;;
    --run=*) RUN_NAME="${arg#*=}" ;;
    --lines=*) LINES="${arg#*=}" ;;
    --no-follow) FOLLOW=0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done
require_common
[[ "$WORKER" == all || "$WORKER" =~ ^[0-9]+$ ]] || die "--worker must be a number or 'all'"
[[ "$LINES" =~ ^[0-9]+$ ]] || die "--lines must be a number"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--run=$RUN_NAME: use letters, digits, '.', '_' or '-'"

log="\$HOME/$REMOTE_LOGS/$RUN_NAME.log"
tail_cmd="tail -n $LINES"
[[ "$FOLLOW" == 1 ]] && tail_cmd+=" -F"
remote="$tail_cmd $log"
if [[ "$WORKER" == all ]]; then
  remote="$remote | sed -u \"s/^/[\$(hostname)] /\""
fi
ssh_all "$WORKER" "$remote"
