# shellcheck shell=bash
# Helpers shared by launch/gcp/common.sh and launch/gpu/common.sh. Sourced, never run.
# `die` exits with $USAGE_EXIT (2 unless the sourcing file sets it).

USAGE_EXIT="${USAGE_EXIT:-2}"

# Print the comment block at the top of a script (its usage), without the '# ' prefixes.
print_usage() {
  awk 'NR == 1 { next } /^#SBATCH/ || !/^#/ { exit } { sub(/^# ?/, ""); print }' "$1"
}

die() {
  echo "error: $*" >&2
  exit "$USAGE_EXIT"
}

warn() {
  echo "warning: $*" >&2
}

# Quote one word for a POSIX shell; plain words are left as they are.
shell_quote() {
  local s="$1"
  if [[ -n "$s" && "$s" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$s"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

# The words as one shell-quoted command line.
quote_words() {
  local out="" w
  for w in "$@"; do
    out+="${out:+ }$(shell_quote "$w")"
  done
  printf '%s' "$out"
}
