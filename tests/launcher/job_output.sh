# Sourced by the launcher tests: $out holds the job's output (removed at
# exit); fail MESSAGE prints it after the message, named by the script,
# and exits 1.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() {
  echo "$(basename "$0" .sh): $1; the job's output:" >&2
  cat "$out" >&2
  exit 1
}
