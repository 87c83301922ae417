#!/usr/bin/env bash
# Copy this checkout to every worker of a TPU VM slice and install spade_jax[tpu] there.
#
#   bash launch/gcp/setup_workers.sh --project=P --zone=Z --bucket=gs://B --tpu=NAME \
#       [--ref=GIT_REF] [--model=gs://B/models/Qwen3-8B] [--python=python3.11] [--dry-run]
#
# The code travels as a `git archive` tarball (tracked files of --ref; by default HEAD plus
# uncommitted changes to tracked files, via `git stash create`, which changes nothing in the
# checkout). Untracked files are NOT included: commit or `git add` them first.
# On each worker: ~/spade_jax (the code), ~/spade_venv (Python >= 3.11 virtualenv with
# spade_jax[tpu]), bubblewrap for the sandbox. --model copies an HF checkpoint directory from
# gs:// to local disk on every worker (REMOTE_MODELS, default /tmp/spade_models/<name>).
# Rerunning replaces the code and reinstalls; it is safe while no training runs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { print_usage "${BASH_SOURCE[0]}"; }

parse_common_args "$@"
REF=""
MODEL=""
PYTHON="${SPADE_PYTHON:-python3}"
for arg in "${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}"; do
  case "$arg" in
    --ref=*) REF="${arg#*=}" ;;
    --model=*) MODEL="${arg#*=}" ;;
    --python=*) PYTHON="${arg#*=}" ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done
require_common

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARBALL="${TMPDIR:-/tmp}/spade_jax-${TPU_NAME}.tar.gz"
REMOTE_TARBALL="/tmp/spade_jax.tar.gz"

# 1. Tarball of the code.
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  run git -C "$REPO_ROOT" archive --format=tar.gz "--output=$TARBALL" "${REF:-HEAD}"
else
  if [[ -z "$REF" ]]; then
    REF="$(git -C "$REPO_ROOT" stash create)"
    REF="${REF:-HEAD}"
  fi
  untracked="$(git -C "$REPO_ROOT" ls-files --others --exclude-standard)"
  if [[ -n "$untracked" ]]; then
    warn "untracked files are not copied to the workers (commit or git add them):"
    echo "$untracked" | sed 's/^/  /' | head -20 >&2
  fi
  run git -C "$REPO_ROOT" archive --format=tar.gz "--output=$TARBALL" "$REF"
fi

# 2. Copy it to every worker.
run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:$REMOTE_TARBALL" \
  "--project=$PROJECT" "--zone=$ZONE" --worker=all

# 3. Unpack and install on every worker (one remote command line; $HOME expands remotely).
q_py="$(shell_quote "$PYTHON")"
steps=(
  "set -e"
  "cd \$HOME"
  "rm -rf $REMOTE_REPO.new && mkdir -p $REMOTE_REPO.new"
  "tar -xzf $REMOTE_TARBALL -C $REMOTE_REPO.new"
  "rm -rf $REMOTE_REPO && mv $REMOTE_REPO.new $REMOTE_REPO"
  "(command -v bwrap >/dev/null || (sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap libseccomp2 >/dev/null))"
  # TPU images run Ubuntu 22.04 (Python 3.10); spade_jax needs Python >= 3.11.
  "(if $q_py -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=$q_py; else sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv >/dev/null && PY=python3.11; fi; [ -x $REMOTE_VENV/bin/python ] || \$PY -m venv $REMOTE_VENV)"
  "$REMOTE_VENV/bin/python -m pip install -q --disable-pip-version-check -U pip"
  "cd $REMOTE_REPO && \$HOME/$REMOTE_VENV/bin/python -m pip install -q --disable-pip-version-check -e '.[tpu]'"
  "\$HOME/$REMOTE_VENV/bin/python -c 'import jax, spade_jax; print(\"spade_jax installed, jax\", jax.__version__)'"
)
if [[ -n "$MODEL" ]]; then
  steps+=("$(remote_model_copy "$MODEL")")
fi
remote="$(printf '%s; ' "${steps[@]}")"
ssh_all all "${remote%; }"

if [[ -n "$MODEL" ]]; then
  echo "model on every worker at $(remote_model_path "$MODEL"): train.sh --model=$MODEL passes it" >&2
fi
