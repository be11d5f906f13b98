#!/usr/bin/env bash
# A migration that straddles a coordinator change: eccl-run --etcd runs the
# elastic demo with three coordinator replicas and a standby; `ecclcoord
# migrate --rank 1` starts moving rank 1 to the standby and the leading
# coordinator is killed at once (SIGUSR1 to eccl-run), while the members are
# still preparing or voting. The successor must take the migration over
# (its log says so), the leaver must leave, the joiner join, and the final
# parameters must still equal a failure-free run. Steps are long (200 ms),
# so the kill lands before the members reach the boundary where they vote.
set -uo pipefail
run=$1 coord=$2 train=$3 etcd_cluster=$4
tmp=$(mktemp -d)
etcd_pid="" job=""
trap '[ -z "$job" ] || kill -9 "$job" 2>/dev/null; [ -z "$etcd_pid" ] || { kill "$etcd_pid"; wait "$etcd_pid"; }; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out; do echo "--- $f"; tail -n 80 "$f"; done; exit 1; }
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}

source "$(dirname "$0")/job_helpers.sh"
start_etcd_cluster "$etcd_cluster" "$tmp" || fail "no etcd cluster"

# Members look for the next leader for longer than a takeover takes (a 1 s lease).
ECCL_DEBUG=INFO ECCL_COORD_FAILOVER_MS=15000 ECCL_TIMEOUT_MS=30000 \
  "$run" -np 4 --standby 1 --etcd "$endpoints" --coordinators 3 --etcd-ttl 1 --timeout 150 --id-file "$tmp/id" \
  "$train" --steps 40 --step-ms 200 > "$tmp/job.out" 2>&1 &
job=$!
for _ in $(seq 300); do [ -s "$tmp/id" ] && break; sleep 0.1; done
[ -s "$tmp/id" ] || fail "eccl-run wrote no job id"
await_formed "$coord" "$tmp/id" "$tmp/status.out" || fail "the job did not form with its standby"
"$coord" migrate --rank 1 --id-file "$tmp/id" > "$tmp/migrate.out" 2>&1 || fail "ecclcoord migrate failed"
kill -USR1 "$job"
grep -q "preparing epoch 2" "$tmp/migrate.out" || fail "migrate did not report the preparation"
wait $job || fail "the job failed (exit $?)"
job=""
grep -q "eccl-run: SIGUSR1: killed the leading coordinator" "$tmp/job.out" || fail "the leader was not killed"
grep -q "took over a migration to epoch 2" "$tmp/job.out" || fail "no successor took the migration over"
grep -q "rank 1 migrated to a standby" "$tmp/job.out" || fail "the leaver did not leave"
grep -q "joined as rank 1" "$tmp/job.out" || fail "the joiner did not join"
grep -q "final parameters equal a failure-free run" "$tmp/job.out" || fail "final parameters differ"
grep -m1 "took over a migration" "$tmp/job.out"
grep -m3 -E "switched over|migrated|joined as" "$tmp/job.out"
echo "migration across a coordinator change: ok"
