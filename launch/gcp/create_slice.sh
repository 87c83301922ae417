#!/usr/bin/env bash
# Create a TPU VM slice through a queued resource and wait until it is ACTIVE.
#
#   bash launch/gcp/create_slice.sh --project=P --zone=us-east5-a --bucket=gs://B \
#       --tpu=spade-v5p-64 --accelerator-type=v5p-64 [--runtime-version=v2-alpha-tpuv5] \
#       [--spot | --best-effort | --reserved] [--valid-until-duration=6h] [--no-wait] \
#       [--wait-timeout=SECONDS] [--dry-run] [-- extra gcloud flags]
#
# Capacity tiers: default is on-demand; --spot (preemptible, cheapest); --best-effort (the
# alpha command's tier); --reserved (your reservation). Flags after `--` go to gcloud as they
# are (e.g. -- --network=my-net --internal-ips).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
TIER=""
WAIT=1
WAIT_TIMEOUT="${WAIT_TIMEOUT:-86400}"
POLL_SECONDS="${POLL_SECONDS:-60}"
VALID_UNTIL=""
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --spot | --best-effort | --reserved)
      [[ -z "$TIER" ]] || die "pick one of --spot, --best-effort, --reserved"
      TIER="$arg"
      ;;
    --no-wait) WAIT=0 ;;
    --wait-timeout=*) WAIT_TIMEOUT="${arg#*=}" ;;
    --valid-until-duration=*) VALID_UNTIL="${arg#*=}" ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done
require_common
require_accelerator

GCLOUD_TPUS=(gcloud compute tpus)
# --best-effort exists only in the alpha command; the GA one has --spot instead.
[[ "$TIER" == --best-effort ]] && GCLOUD_TPUS=(gcloud alpha compute tpus)

create=("${GCLOUD_TPUS[@]}" queued-resources create "$QUEUED_RESOURCE"
  "--project=$PROJECT" "--zone=$ZONE" "--node-id=$TPU_NAME"
  "--accelerator-type=$ACCELERATOR_TYPE" "--runtime-version=$RUNTIME_VERSION")
[[ -n "$TIER" ]] && create+=("$TIER")
[[ -n "$VALID_UNTIL" ]] && create+=("--valid-until-duration=$VALID_UNTIL")
create+=("${PASSTHROUGH_ARGS[@]+"${PASSTHROUGH_ARGS[@]}"}")
run "${create[@]}"

describe=(gcloud compute tpus queued-resources describe "$QUEUED_RESOURCE"
  "--project=$PROJECT" "--zone=$ZONE" "--format=value(state.state)")
if [[ "$WAIT" == 0 ]]; then
  exit 0
fi
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  run "${describe[@]}"  # what the wait loop polls until it prints ACTIVE
  exit 0
fi

echo "waiting for queued resource $QUEUED_RESOURCE to become ACTIVE (polling every ${POLL_SECONDS}s," \
  "up to ${WAIT_TIMEOUT}s; Ctrl-C stops waiting, not the request)" >&2
start=$SECONDS
while true; do
  state="$("${describe[@]}" 2>/dev/null || echo UNKNOWN)"
  echo "$(date -u +%H:%M:%S) $QUEUED_RESOURCE: $state" >&2
  case "$state" in
    ACTIVE)
      echo "slice $TPU_NAME is ready: next, bash launch/gcp/setup_workers.sh" >&2
      exit 0
      ;;
    FAILED | SUSPENDED | SUSPENDING)
      echo "error: queued resource $QUEUED_RESOURCE is $state; details:" >&2
      gcloud compute tpus queued-resources describe "$QUEUED_RESOURCE" \
        "--project=$PROJECT" "--zone=$ZONE" >&2 || true
      echo "delete it with: bash launch/gcp/delete_slice.sh --tpu=$TPU_NAME" >&2
      exit 1
      ;;
  esac
  if ((SECONDS - start > WAIT_TIMEOUT)); then
    echo "error: $QUEUED_RESOURCE still $state after ${WAIT_TIMEOUT}s; the request stays queued" \
      "(delete it with launch/gcp/delete_slice.sh)" >&2
    exit 1
  fi
  sleep "$POLL_SECONDS"
done
