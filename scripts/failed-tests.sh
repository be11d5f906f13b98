#!/usr/bin/env bash
# failed-tests.sh LOG [HEAD] [TAIL]: from a ctest log written with
# --output-on-failure, each failed or timed-out test's name and the first
# HEAD (default 15) and last TAIL (default 30) lines of what it printed,
# and between them up to 20 lines that say what failed.
# The whole log can run to thousands of lines; whoever reads only its end
# (CI's excerpt) sees the failure this way.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 LOG [HEAD] [TAIL]" >&2; exit 2; }
awk -v head="${2:-15}" -v tail="${3:-30}" '
  function flush(   i, said) {
    if (name == "") return
    print "--- " name
    for (i = 1; i <= n; i++) {
      if (i <= head || i > n - tail) print buf[i]
      else if (said < 20 && buf[i] ~ /Failure|FAILED|[Ee]rror|rank [0-9]+: |^ettr: |^  #[0-9]+ /) { print "    " buf[i]; said++ }
    }
    name = ""; n = 0
  }
  /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / { flush(); if ($0 ~ /\*\*\*(Failed|Timeout|Exception|Not Run)/) name = $0; next }
  /^ *Start +[0-9]+: / || /^[0-9]+% tests passed/ { flush(); next }
  name != "" { buf[++n] = $0 }
  END { flush() }
' "$1"
