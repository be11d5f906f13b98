#!/usr/bin/env bash
# Hostile connections to every listener of a training job, while rank 2 is
# killed and a standby takes its rank: the job must finish with parameters
# bit-identical to a failure-free run, and nobody but rank 2 may be
# declared failed (no missed heartbeat, no lost coordinator).
#   flood.sh eccl-run|ecclcoord|eccl-run-etcd MODES ECCL_RUN ECCLCOORD ELASTIC_TRAIN [ETCD_CLUSTER]
# eccl-run: the launcher's own coordinator; ecclcoord: the `ecclcoord
# serve` daemon, with the ranks and the standby started by hand;
# eccl-run-etcd: eccl-run --etcd's three replicated coordinators on a real
# three-node etcd cluster (ETCD_CLUSTER starts it): the leader's port is
# attacked, the others refuse connections.
# MODES: flood.py's (silent,slow,garbage,many).
set -uo pipefail
launch=$1 modes=$2 run=$3 coord=$4 train=$5 etcd_cluster=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
pids=()
etcd_pid=""
# The etcd cluster is stopped in order: it removes its nodes' data.
trap 'kill -9 "${pids[@]}" 2>/dev/null; [ -z "$etcd_pid" ] || { kill "$etcd_pid"; wait "$etcd_pid"; }; rm -rf "$out"' EXIT
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
steps=80 kill_at=4
echo "flood: $modes against every listener of a job started by $launch; rank 2 killed at ${kill_at} s"

if [ "$launch" = eccl-run ] || [ "$launch" = eccl-run-etcd ]; then
  replicated=()
  if [ "$launch" = eccl-run-etcd ]; then
    [ -n "$etcd_cluster" ] || { echo "FAIL: eccl-run-etcd needs the etcd_cluster program"; exit 1; }
    source "$here/job_helpers.sh"
    start_etcd_cluster "$etcd_cluster" "$out" || { echo "FAIL: no etcd cluster"; cat "$out/etcd.log"; exit 1; }
    replicated=(--etcd "$endpoints" --coordinators 3)
  fi
  "$run" -np 4 --standby 1 "${replicated[@]}" --kill "2@$kill_at" --timeout 150 "$train" --steps $steps \
    >"$out/job.log" 2>&1 &
  job=$!
  pids+=("$job")
  victims=$job
  coordinator=$job
else
  "$coord" serve >"$out/id" 2>"$out/coord.log" &
  coordinator=$!
  pids+=("$coordinator")
  for _ in $(seq 100); do [ -s "$out/id" ] && break; sleep 0.1; done
  export ECCL_UNIQUE_ID
  ECCL_UNIQUE_ID=$(sed -n 's/^ECCL_UNIQUE_ID=//p' "$out/id")
  [ -n "$ECCL_UNIQUE_ID" ] || { echo "FAIL: ecclcoord serve printed no id"; cat "$out/coord.log"; exit 1; }
  ranks=()
  for r in 0 1 2 3; do
    ECCL_RANK=$r ECCL_NRANKS=4 "$train" --steps $steps >"$out/rank$r.log" 2>&1 &
    ranks+=($!)
  done
  ECCL_ROLE=standby ECCL_NRANKS=4 "$train" --steps $steps >"$out/standby.log" 2>&1 &
  ranks+=($!)
  pids+=("${ranks[@]}")
  victims="$coordinator,$(IFS=,; echo "${ranks[*]}")"
  (sleep "$kill_at"; kill -9 "${ranks[2]}") &
  job=""
fi

python3 "$here/flood.py" --pids "$victims" --coordinator-pid "$coordinator" --modes "$modes" --seconds 120 \
  >"$out/flood.log" 2>&1 &
flood=$!
pids+=("$flood")

rc=0
if [ -n "$job" ]; then
  wait "$job" || rc=$?
else
  for i in 0 1 3 4; do wait "${ranks[$i]}" || rc=$?; done
  kill "$coordinator"
  wait "$coordinator" 2>/dev/null
  cat "$out"/rank*.log "$out/standby.log" "$out/coord.log" >"$out/job.log"
fi
wait "$flood"
flood_rc=$?
tail -1 "$out/flood.log"

fail() {
  echo "FAIL: $*"
  echo "--- flood"; tail -15 "$out/flood.log"
  # The refusals of the flood's connections drown everything else.
  echo "--- job (the first 80 lines that are not refusals of the flood)"
  grep -vE "rejected (member|coordinator)|more unauthenticated connections" "$out/job.log" | head -80
  exit 1
}
[ $flood_rc -eq 0 ] || fail "the flood found no listener to attack"
listeners=$(sed -n 's/^flood: \([0-9]*\) listeners.*/\1/p' "$out/flood.log")
# The coordinator, then each of the 5 processes' TCP and local sockets.
[ "${listeners:-0}" -ge 11 ] || fail "the flood reached $listeners listeners, not all 11"
[ $rc -eq 0 ] || fail "the job failed (exit $rc)"
grep -q "final parameters equal a failure-free run" "$out/job.log" || fail "no checked result"
grep -q "standby promoted to rank 2" "$out/job.log" || fail "the standby did not take rank 2"
bad=$(grep -E "coordinator: .* failed: " "$out/job.log" | grep -v "coordinator: rank 2 (" || true)
[ -z "$bad" ] || fail "a member other than the killed rank was declared failed: $bad"
! grep -qE "no heartbeat|lost the coordinator" "$out/job.log" || fail "heartbeats were missed under the flood"
grep -q "rejected coordinator: connection from" "$out/job.log" || fail "the coordinator logged no rejected connection"
grep -q "rejected member " "$out/job.log" || fail "no member logged a rejected connection"
echo "flood: ok"
