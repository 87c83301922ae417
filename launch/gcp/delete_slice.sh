#!/usr/bin/env bash
# Delete a TPU VM slice: its queued resource and the node it created.
#
#   bash launch/gcp/delete_slice.sh --project=P --zone=Z --bucket=gs://B --tpu=NAME \
#       [--queued-resource=QR] [--node-only] [--async] [--yes] [--dry-run]
#
# Deletes the queued resource with --force, which deletes its node too (this stops billing).
# --node-only deletes just a node made without a queued resource (gcloud ... tpu-vm create).
# The workdir on gs:// is kept. Asks for confirmation unless --yes (or --dry-run).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
NODE_ONLY=0
ASYNC=0
YES=0
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --node-only) NODE_ONLY=1 ;;
    --async) ASYNC=1 ;;
    --yes | -y) YES=1 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done
require_common

if [[ "$NODE_ONLY" == 1 ]]; then
  what="TPU node $TPU_NAME"
  cmd=(gcloud compute tpus tpu-vm delete "$TPU_NAME" "--project=$PROJECT" "--zone=$ZONE" --quiet)
else
  what="queued resource $QUEUED_RESOURCE and its TPU node $TPU_NAME"
  cmd=(gcloud compute tpus queued-resources delete "$QUEUED_RESOURCE" "--project=$PROJECT"
    "--zone=$ZONE" --force --quiet)
fi
[[ "$ASYNC" == 1 ]] && cmd+=(--async)

if [[ "${DRY_RUN:-0}" != 1 && "$YES" != 1 ]]; then
  [[ -t 0 ]] || die "refusing to delete $what without a terminal to confirm: pass --yes"
  read -r -p "delete $what in $PROJECT/$ZONE? [y/N] " answer
  [[ "$answer" == y || "$answer" == Y || "$answer" == yes ]] || { echo "not deleted" >&2; exit 1; }
fi
run "${cmd[@]}"
