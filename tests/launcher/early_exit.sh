#!/usr/bin/env bash
# A rank whose process ends before it registers no longer holds the others
# in formation until their deadline: eccl-run tells the coordinator, which
# hands the rank to an idle standby (or the next to register: --respawn's).
#   early_exit.sh ECCL_RUN ELASTIC_TRAIN
set -euo pipefail
run=${1:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
train=${2:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
# shellcheck source=job_output.sh
source "$(dirname "$0")/job_output.sh"
export ECCL_SOCKET_IFNAME=lo
dies='if [ "$ECCL_ROLE" = rank ] && [ "$ECCL_RANK" = 1 ]; then exit 3; fi; exec "$0" "$@"'

for pool in "--standby 1" "--respawn 0"; do
  rc=0
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$run" -np 3 $pool --timeout 60 sh -c "$dies" "$train" --steps 100 --size 1024 --step-ms 5 >"$out" 2>&1 || rc=$?
  took=$(($(date +%s) - start))
  # The rank that failed on its own is counted: exit 1, not 0.
  [ "$rc" -eq 1 ] || fail "$pool: exit $rc, not 1"
  grep -qE "rank 1 ended before the job formed \(pid [0-9]+ exited with status 3\)" "$out" ||
    fail "$pool: the launcher did not say rank 1 ended before the job formed"
  grep -q "final parameters equal a failure-free run" "$out" || fail "$pool: the job did not end equal to a failure-free run"
  [ "$took" -lt 30 ] || fail "$pool: the job took $took s (it waited for its deadline)"
  echo "early_exit: $pool: rank 1 ended before registering; a standby took its rank ($took s)"
done
