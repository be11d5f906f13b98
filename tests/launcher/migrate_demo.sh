#!/usr/bin/env bash
# Expected migration end to end: eccl-run runs the elastic demo with a
# standby; `ecclcoord migrate --rank 1` (talking to eccl-run's embedded
# coordinator) moves rank 1 to the standby while training goes on; the
# leaver streams the model, everyone switches over, and the final
# parameters still equal a failure-free run. Also checks ecclcoord's
# status and refusal paths, and `ecclcoord serve` as a standalone daemon.
set -uo pipefail
run=$1 coord=$2 train=$3 perf=$4
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }

"$run" -np 4 --standby 1 --timeout 120 --id-file "$tmp/id" "$train" --steps 60 --step-ms 40 > "$tmp/job.out" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$tmp/id" ] && break; sleep 0.1; done
[ -s "$tmp/id" ] || fail "eccl-run wrote no job id"
source "$(dirname "$0")/job_helpers.sh"
await_formed "$coord" "$tmp/id" "$tmp/status.out" || fail "status does not show the formed view with its standby"
if "$coord" migrate --rank 9 --id-file "$tmp/id" > "$tmp/refused.out" 2>&1; then fail "migrating rank 9 of 4 succeeded"; fi
grep -q "outside" "$tmp/refused.out" || fail "refusal does not say why"
"$coord" migrate --rank 1 --id-file "$tmp/id" > "$tmp/migrate.out" 2>&1 || fail "ecclcoord migrate failed"
grep -q "preparing epoch 2" "$tmp/migrate.out" || fail "migrate did not report the preparation"
wait $job || fail "the job failed (exit $?)"
grep -q "rank 1 migrated to a standby" "$tmp/job.out" || fail "the leaver did not leave"
grep -q "joined as rank 1" "$tmp/job.out" || fail "the joiner did not join"
grep -q "switched over at step" "$tmp/job.out" || fail "no stayer switched over"
grep -q "opened at the switch 0" "$tmp/job.out" || fail "connections were opened at the switchover"
grep -q "final parameters equal a failure-free run" "$tmp/job.out" || fail "final parameters differ"
grep -m3 -E "switched over|migrated|joined" "$tmp/job.out"

# The daemon: ranks started by hand (any launcher) join it through the id.
"$coord" serve --id-file "$tmp/daemon-id" > "$tmp/serve.out" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -s "$tmp/daemon-id" ] && break; sleep 0.1; done
id=$(cat "$tmp/daemon-id")
pids=()
for r in 0 1; do
  ECCL_SOCKET_IFNAME=lo ECCL_UNIQUE_ID=$id ECCL_RANK=$r ECCL_NRANKS=2 timeout 60 "$perf" -b 1K -e 64K -f 8 -n 2 -w 1 -c 1 \
    > "$tmp/rank$r.out" 2>&1 &
  pids+=($!)
done
for r in 0 1; do wait "${pids[$r]}" || fail "rank $r under ecclcoord serve failed"; done
"$coord" status --id "$id" > "$tmp/daemon-status.out" 2>&1 || fail "status against the daemon failed"
grep -q "epoch 1, 2 ranks" "$tmp/daemon-status.out" || fail "daemon status does not show the job"
kill -TERM $daemon
wait $daemon || fail "ecclcoord serve did not stop cleanly on SIGTERM"
echo "migration demo and ecclcoord: ok"
