#!/usr/bin/env bash
# A whole run on a TPU VM slice: create it, set up every worker, train on all of them, watch,
# resume on a fresh slice after a preemption, and delete the slice when the run has ended.
#
#   bash launch/gcp/pod_run.sh --project=P --zone=Z --bucket=gs://B --tpu=NAME \
#       --accelerator-type=v5p-64 --config=configs/30b.py --run=NAME \
#       [--spot | --best-effort | --reserved] [--model=gs://B/models/M] [--poll=SECONDS] \
#       [--max-restarts=N] [--keep-slice] [--dry-run] [-- arguments for launch/train.py]
#
# Steps (each one the script of this directory that does it): create_slice.sh (waits until
# ACTIVE), setup_workers.sh, train.sh on every worker with workdir $BUCKET/runs/<run>; then
# every --poll seconds (default 300) the queued resource's state and, on worker 0, whether the
# training process lives, with the last lines of its log. A state other than ACTIVE (a spot
# slice is SUSPENDED when preempted) is a lost slice: delete it, create a new one, set it up
# and start train.sh with the same --run, which resumes from the newest checkpoint in the
# bucket (at most --max-restarts times, default 10). When the training process has ended, the
# slice is deleted (the workdir stays) unless --keep-slice. --dry-run prints every command of
# that sequence once, the resume branch included, each step under a '# step' comment line.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
TIER=()
CONFIG=""
RUN_NAME=""
MODEL=()
POLL=300
MAX_RESTARTS=10
KEEP_SLICE=0
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --spot | --best-effort | --reserved) TIER=("$arg") ;;
    --config=*) CONFIG="${arg#*=}" ;;
    --run=*) RUN_NAME="${arg#*=}" ;;
    --model=*) MODEL=("$arg") ;;
    --poll=*) POLL="${arg#*=}" ;;
    --max-restarts=*) MAX_RESTARTS="${arg#*=}" ;;
    --keep-slice) KEEP_SLICE=1 ;;
    *) die "unknown argument '$arg' (arguments for launch/train.py go after --)" ;;
  esac
done
require_common
require_accelerator
require CONFIG
[[ -n "$RUN_NAME" ]] || die "pass --run=NAME: a resumed run must find its workdir again"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--run=$RUN_NAME: use letters, digits, '.', '_' or '-'"
[[ "$POLL" =~ ^[0-9]+$ && "$POLL" -ge 1 ]] || die "--poll=$POLL must be a number of seconds >= 1"
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "--max-restarts=$MAX_RESTARTS must be a number"

HERE="$(dirname "${BASH_SOURCE[0]}")"
export DRY_RUN="${DRY_RUN:-0}"
scope=("--project=$PROJECT" "--zone=$ZONE" "--bucket=$BUCKET" "--tpu=$TPU_NAME"
  "--queued-resource=$QUEUED_RESOURCE")
passthrough=()
((${#PASSTHROUGH_ARGS[@]})) && passthrough=(-- "${PASSTHROUGH_ARGS[@]}")

step() {
  if [[ "$DRY_RUN" == 1 ]]; then echo "# $*"; else echo "== $(date -u +%H:%M:%S) $*" >&2; fi
}

create() {
  step "create $ACCELERATOR_TYPE slice $TPU_NAME and wait until it is ACTIVE"
  bash "$HERE/create_slice.sh" "${scope[@]}" "--accelerator-type=$ACCELERATOR_TYPE" \
    "--runtime-version=$RUNTIME_VERSION" "${TIER[@]+"${TIER[@]}"}"
}

setup() {
  step "set up every worker"
  bash "$HERE/setup_workers.sh" "${scope[@]}" "${MODEL[@]+"${MODEL[@]}"}"
}

train() {
  step "$1"
  bash "$HERE/train.sh" "${scope[@]}" "--config=$CONFIG" "--run=$RUN_NAME" \
    "${MODEL[@]+"${MODEL[@]}"}" "${passthrough[@]+"${passthrough[@]}"}"
}

delete() {
  step "$1"
  bash "$HERE/delete_slice.sh" "${scope[@]}" --yes
}

state_cmd=(gcloud compute tpus queued-resources describe "$QUEUED_RESOURCE" "--project=$PROJECT"
  "--zone=$ZONE" "--format=value(state.state)")
logs="\$HOME/$REMOTE_LOGS"
# shellcheck disable=SC2016
alive_cmd='if [ -f '"$logs"'/train.pid ] && kill -0 "$(cat '"$logs"'/train.pid)" 2>/dev/null; then echo RUNNING; else echo ENDED; fi; tail -n 3 '"$logs/$RUN_NAME.log"

# Print "RUNNING" or "ENDED" (first line) and the log's last lines; nothing when ssh fails.
training_status() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--project=$PROJECT" "--zone=$ZONE" --worker=0 \
    "--command=$alive_cmd" 2>/dev/null || true
}

create
setup
train "train on all workers: run $RUN_NAME, workdir $BUCKET/runs/$RUN_NAME"

if [[ "$DRY_RUN" == 1 ]]; then
  step "every ${POLL}s: the slice's state (ACTIVE while it lives)"
  run "${state_cmd[@]}"
  step "and on worker 0: is the training process alive, the log's last lines"
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--project=$PROJECT" "--zone=$ZONE" --worker=0 \
    "--command=$alive_cmd"
  step "follow the log yourself (any time, Ctrl-C stops following only)"
  bash "$HERE/logs.sh" "${scope[@]}" "--run=$RUN_NAME"
  step "after a preemption (state not ACTIVE): a new slice, resumed from the bucket"
  delete "delete the lost slice"
  create
  setup
  train "resume run $RUN_NAME on all workers from its newest checkpoint"
  delete "the run has ended: delete the slice (the workdir $BUCKET/runs/$RUN_NAME stays)"
  exit 0
fi

restarts=0
while true; do
  sleep "$POLL"
  state="$("${state_cmd[@]}" 2>/dev/null || echo UNKNOWN)"
  if [[ "$state" != ACTIVE ]]; then
    if ((restarts >= MAX_RESTARTS)); then
      echo "error: slice $TPU_NAME is $state and --max-restarts=$MAX_RESTARTS is used up;" \
        "resume later with train.sh --run=$RUN_NAME" >&2
      exit 1
    fi
    restarts=$((restarts + 1))
    echo "slice $TPU_NAME is $state (preempted?): restart $restarts of $MAX_RESTARTS" >&2
    delete "delete the lost slice"
    create
    setup
    train "resume run $RUN_NAME on all workers from its newest checkpoint"
    continue
  fi
  status="$(training_status)"
  echo "$(date -u +%H:%M:%S) $TPU_NAME $state: ${status:-worker 0 did not answer}" >&2
  if [[ "$status" == ENDED* ]]; then
    break
  fi
done
if [[ "$KEEP_SLICE" == 1 ]]; then
  echo "run $RUN_NAME ended; slice $TPU_NAME kept (--keep-slice): delete it with" \
    "delete_slice.sh --tpu=$TPU_NAME" >&2
else
  delete "the run has ended: delete the slice (the workdir $BUCKET/runs/$RUN_NAME stays)"
fi
