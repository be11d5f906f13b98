#!/usr/bin/env bash
# A hung rank (SIGSTOP) is declared failed and fenced by the coordinator;
# eccl-run kills it then, rather than leaving it to a watchdog or
# --timeout, and a --respawn repair starts at that moment (an ETTR run's
# stopped rank held its repair until the harness's watchdog killed it).
#   fenced_repair.sh ECCL_RUN ELASTIC_TRAIN
set -euo pipefail
run=${1:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
train=${2:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
# shellcheck source=job_output.sh
source "$(dirname "$0")/job_output.sh"
seconds_of() { sed -nE "s/.*$1.* at ([0-9.]+) s$/\1/p" "$out" | head -1; }
export ECCL_SOCKET_IFNAME=lo ECCL_HEARTBEAT_TIMEOUT_MS=1000

# A standby takes the hung rank's place: the job ends as a failure-free
# run would, the hung process killed, not waited for.
"$run" -np 3 --standby 1 --stop 1@1.5 --timeout 60 "$train" --steps 400 --size 1024 --step-ms 10 >"$out" 2>&1 || true
grep -qE "rank 1 \(pid [0-9]+\) was declared failed and is fenced: killed" "$out" || fail "the fenced rank was not killed"
grep -q "final parameters equal a failure-free run" "$out" || fail "the job did not end equal to a failure-free run"
echo "fenced_repair: a stopped rank fenced and killed at $(seconds_of "was declared failed") s (stopped at 1.5 s)"

# No standby: the survivors shrink, and --respawn starts the repair as
# soon as the hung rank is killed.
"$run" -np 3 --respawn 0 --stop 1@1.5 --timeout 60 "$train" --steps 400 --size 1024 --step-ms 10 >"$out" 2>&1 || true
killed=$(seconds_of "was declared failed")
started=$(seconds_of "--respawn: standby s0 started")
[ -n "$killed" ] || fail "the fenced rank was not killed"
[ -n "$started" ] || fail "no repair was started"
awk -v k="$killed" -v s="$started" 'BEGIN { exit !(s >= k && s - k < 2) }' ||
  fail "the repair started at $started s, the kill was at $killed s"
echo "fenced_repair: killed at $killed s, its repair started at $started s"
