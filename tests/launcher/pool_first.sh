#!/usr/bin/env bash
# --pool-first: the ranks start once every standby has registered, so a
# rank that dies at its first step finds one (an ETTR run's first failure
# came before its standby, starting at nice 19, had registered, and the
# job shrank); a standby that ends before it registers stops the launch.
#   pool_first.sh ECCL_RUN ELASTIC_TRAIN
set -euo pipefail
run=${1:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
train=${2:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
# shellcheck source=job_output.sh
source "$(dirname "$0")/job_output.sh"
export ECCL_SOCKET_IFNAME=lo

# The standby takes 2 s to start; rank 1 dies 0.1 s after the ranks start.
slow='if [ "$ECCL_ROLE" = standby ]; then sleep 2; fi; exec "$0" "$@"'
"$run" -np 3 --standby 1 --pool-first --kill 1@0.1 --timeout 60 \
  sh -c "$slow" "$train" --steps 300 --size 1024 --step-ms 10 >"$out" 2>&1 || fail "the job failed"
waited=$(sed -nE 's/.*--pool-first: 1 standbys registered after ([0-9.]+) s.*/\1/p' "$out")
[ -n "$waited" ] || fail "no word that the pool registered"
awk -v w="$waited" 'BEGIN { exit !(w >= 2) }' || fail "the ranks started after $waited s, before the standby could"
grep -q "final parameters equal a failure-free run" "$out" || fail "the job did not end equal to a failure-free run"
echo "pool_first: ranks started once the standby registered ($waited s); rank 1 killed at 0.1 s was replaced"

# A standby that ends before it registers: no rank starts, the launcher says why.
rc=0
"$run" -np 2 --standby 1 --pool-first --timeout 60 \
  sh -c 'if [ "$ECCL_ROLE" = standby ]; then exit 3; fi; echo "a rank ran"' >"$out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "exit $rc, not 2"
grep -qE "standby s0 \(pid [0-9]+\) ended before it registered \(exit 3\); no rank started" "$out" ||
  fail "the launcher did not say why"
if grep -q "a rank ran" "$out"; then fail "a rank started"; fi
echo "pool_first: a standby that ended before registering stopped the launch (exit 2)"
