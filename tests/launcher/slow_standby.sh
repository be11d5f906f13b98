#!/usr/bin/env bash
# A standby that takes longer than 10 s to start (Python importing torch on
# a loaded host) still counts in the pool: --refill starts no second one
# while it starts (eccl-run used to start one more every 10 s; ETTR runs
# under load grew the pool to ten standbys).
#   slow_standby.sh ECCL_RUN
set -euo pipefail
run=${1:?usage: $0 ECCL_RUN}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$run" -np 1 --standby 1 --refill --timeout 60 \
  sh -c 'if [ "$ECCL_ROLE" = standby ]; then echo "standby started"; fi; sleep 14' >"$out" 2>&1 || true
started=$(grep -c "standby started" "$out" || true)
if [ "$started" -ne 1 ]; then
  echo "slow_standby: $started standbys started for a pool of one:" >&2
  cat "$out" >&2
  exit 1
fi
echo "slow_standby: one standby for a pool of one over 14 s"

# The ranks done while a standby still starts: nobody is left to promote
# it, so it is released at once rather than awaited until it registers
# (an ETTR job's end waited 15 s for a refill still importing torch).
start=$(date +%s)
"$run" -np 1 --standby 1 --refill --timeout 60 \
  sh -c 'if [ "$ECCL_ROLE" = standby ]; then exec sleep 40; fi; sleep 1' >"$out" 2>&1 || true
took=$(($(date +%s) - start))
if [ "$took" -ge 20 ]; then
  echo "slow_standby: the job's end waited $took s for a standby still starting:" >&2
  cat "$out" >&2
  exit 1
fi
echo "slow_standby: a standby still starting at the end was released after $took s"
