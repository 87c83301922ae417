# shellcheck shell=bash disable=SC2034
# (SC2034: the variables set here are read by the scripts that source this file.)
# Shared helpers of the launch/gcp/*.sh scripts. Sourced, never run.
#
# Every script takes the same settings, from flags or from the environment (flags win):
#   --project=P            PROJECT           GCP project (required)
#   --zone=Z               ZONE              zone of the TPU, e.g. us-east5-a (required)
#   --bucket=gs://B        BUCKET            bucket for workdirs and checkpoints (required)
#   --tpu=NAME             TPU_NAME          TPU VM (node) name (required)
#   --queued-resource=QR   QUEUED_RESOURCE   queued resource id (default: the TPU name)
#   --accelerator-type=T   ACCELERATOR_TYPE  v5litepod-N (v5e), v5p-N, v6e-N
#   --runtime-version=R    RUNTIME_VERSION   default from the accelerator type (see below)
#   --dry-run              DRY_RUN=1         print the commands instead of running them
# A missing required setting stops the script with exit status 2 and a message naming it.
#
# In --dry-run mode each command is printed on one line of stdout, quoted so it can be pasted
# into a shell; nothing is executed and gcloud need not be installed.

# shellcheck source=launch/shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_lib.sh"

# Remote layout on every TPU worker (overridable through the environment).
REMOTE_REPO="${REMOTE_REPO:-spade_jax}"          # relative to the remote $HOME
REMOTE_VENV="${REMOTE_VENV:-spade_venv}"         # relative to the remote $HOME
REMOTE_LOGS="${REMOTE_LOGS:-spade_logs}"         # relative to the remote $HOME
REMOTE_MODELS="${REMOTE_MODELS:-/tmp/spade_models}"  # local disk; the boot disk is 100 GB

# Run a command, or print it in --dry-run mode.
run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    quote_words "$@"
    printf '\n'
  else
    echo "+ $(quote_words "$@")" >&2
    "$@"
  fi
}

# Parse the common flags out of "$@". Flags a script handles itself are left in EXTRA_ARGS
# (in order); everything after a literal `--` goes to PASSTHROUGH_ARGS.
EXTRA_ARGS=()
PASSTHROUGH_ARGS=()
parse_common_args() {
  EXTRA_ARGS=()
  PASSTHROUGH_ARGS=()
  while (($#)); do
    case "$1" in
      --project=*) PROJECT="${1#*=}" ;;
      --zone=*) ZONE="${1#*=}" ;;
      --bucket=*) BUCKET="${1#*=}" ;;
      --tpu=* | --name=*) TPU_NAME="${1#*=}" ;;
      --queued-resource=*) QUEUED_RESOURCE="${1#*=}" ;;
      --accelerator-type=*) ACCELERATOR_TYPE="${1#*=}" ;;
      --runtime-version=*) RUNTIME_VERSION="${1#*=}" ;;
      --dry-run) DRY_RUN=1 ;;
      --project | --zone | --bucket | --tpu | --name | --queued-resource | --accelerator-type | \
        --runtime-version)
        die "write $1=VALUE (with '=')" ;;
      -h | --help)
        usage
        exit 0
        ;;
      --)
        shift
        PASSTHROUGH_ARGS=("$@")
        break
        ;;
      *) EXTRA_ARGS+=("$1") ;;
    esac
    shift
  done
  QUEUED_RESOURCE="${QUEUED_RESOURCE:-${TPU_NAME:-}}"
}

# require VAR... : stop with a message naming the first missing variable and its flag.
require() {
  local var flag
  for var in "$@"; do
    if [[ -z "${!var:-}" ]]; then
      flag="--$(echo "$var" | tr '[:upper:]_' '[:lower:]-')"
      [[ "$var" == TPU_NAME ]] && flag="--tpu"
      die "$var is not set: pass $flag=... or export $var=... (see launch/gcp/README.md)"
    fi
  done
}

# The settings every script needs: project, zone, bucket (a gs:// URL), and the TPU name.
require_common() {
  require PROJECT ZONE BUCKET TPU_NAME
  [[ "$BUCKET" == gs://* ]] || die "BUCKET must be a gs:// URL, got '$BUCKET'"
  BUCKET="${BUCKET%/}"
  if [[ "${DRY_RUN:-0}" != 1 ]] && ! command -v gcloud >/dev/null 2>&1; then
    die "gcloud is not installed: see https://cloud.google.com/sdk/docs/install (or use --dry-run)"
  fi
}

# The TPU software image that matches an accelerator type.
default_runtime_version() {
  case "$1" in
    v5litepod-* | v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    v4-*) echo "tpu-ubuntu2204-base" ;;
    *) return 1 ;;
  esac
}

require_accelerator() {
  require ACCELERATOR_TYPE
  case "$ACCELERATOR_TYPE" in
    v5e-*) die "ACCELERATOR_TYPE=$ACCELERATOR_TYPE: Cloud TPU names v5e slices v5litepod-N (e.g. v5litepod-16)" ;;
    v5litepod-[0-9]* | v5p-[0-9]* | v6e-[0-9]* | v4-[0-9]*) ;;
    *) die "ACCELERATOR_TYPE=$ACCELERATOR_TYPE is not a TPU type: use v5litepod-N, v5p-N or v6e-N" ;;
  esac
  if [[ -z "${RUNTIME_VERSION:-}" ]]; then
    RUNTIME_VERSION="$(default_runtime_version "$ACCELERATOR_TYPE")" || true
  fi
  require RUNTIME_VERSION
}

# gcloud flags shared by every call.
gcloud_scope() {
  printf '%s\n' "--project=$PROJECT" "--zone=$ZONE"
}

# gcloud compute tpus tpu-vm ssh on every worker with one remote command line.
ssh_all() {
  local worker="$1" command="$2"
  local scope=()
  mapfile -t scope < <(gcloud_scope)
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${scope[@]}" "--worker=$worker" \
    "--command=$command"
}

# A remote command that copies a gs:// model directory to local disk once per worker and
# prints nothing else; the local path is "$REMOTE_MODELS/<basename>".
remote_model_path() {
  local src="${1%/}"
  printf '%s/%s' "$REMOTE_MODELS" "${src##*/}"
}

remote_model_copy() {
  local src="${1%/}" dest
  [[ "$src" == gs://* ]] || die "--model must be a gs:// directory of an HF checkpoint, got '$1'"
  dest="$(remote_model_path "$src")"
  # Copy into a staging directory and rename, so an interrupted copy is never mistaken for
  # a complete one.
  printf 'if [ ! -d %s ]; then rm -rf %s && mkdir -p %s && gcloud storage cp -r %s %s && mv %s %s; fi' \
    "$(shell_quote "$dest")" "$(shell_quote "$dest.partial")" "$(shell_quote "$dest.partial")" \
    "$(shell_quote "$src/*")" "$(shell_quote "$dest.partial/")" \
    "$(shell_quote "$dest.partial")" "$(shell_quote "$dest")"
}
