#!/usr/bin/env bash
# A leading coordinator cut off from etcd by the network, not by stopping
# etcd: replica a runs in a network namespace joined to this one by a veth;
# the members reach it over the veth and it reaches etcd at another address
# on the same link. A blackhole route for etcd's address inside the
# namespace cuts a off from etcd and from nothing else: a must stop leading
# (its writes are conditioned on a lease it can no longer renew), replica b
# here takes over, the members (the elastic demo's four ranks and a standby)
# resume with b without anyone being declared, and a rank killed after that
# is replaced through b; the final parameters must equal a failure-free
# run. Fails where namespaces cannot be made (it needs root, as CI has).
set -uo pipefail
coord=$1 train=$2 etcd_cluster=$3
tmp=$(mktemp -d)
tag=$$
ns=ecclpart$tag veth=ecclp$tag net=10.214.$((tag % 200))
source "$(dirname "$0")/stale_netns.sh"
reap_stale_namespaces
pids=() etcd_pid=""
cleanup() {
  kill -9 "${pids[@]}" 2>/dev/null
  [ -z "$etcd_pid" ] || { kill "$etcd_pid"; wait "$etcd_pid"; }
  ip netns del "$ns" 2>/dev/null
  ip link del "$veth" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "--- $f"; tail -n 40 "$f"; done
  exit 1
}
waitFor() {  # waitFor SECONDS FILE PATTERN
  for _ in $(seq $(($1 * 10))); do grep -q "$3" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

ip netns add "$ns" 2>/dev/null || fail "cannot create network namespaces here (the test needs root and CAP_NET_ADMIN)"
set -e
ip link add "$veth" type veth peer name ecclv0 netns "$ns"
ip addr add "$net.1/24" dev "$veth"  # the members' side of the link
ip addr add "$net.3/24" dev "$veth"  # etcd's address
ip link set "$veth" up
ip netns exec "$ns" ip addr add "$net.2/24" dev ecclv0
ip netns exec "$ns" ip link set ecclv0 up
ip netns exec "$ns" ip link set lo up
set +e

source "$(dirname "$0")/job_helpers.sh"
start_etcd_cluster "$etcd_cluster" "$tmp" "$net.3" || fail "no etcd cluster"

serve=(serve --etcd "$endpoints" --etcd-prefix /partition/ --etcd-ttl 1 --replicas 2)
ECCL_DEBUG=INFO ip netns exec "$ns" "$coord" "${serve[@]}" --listen "$net.2" --id-file "$tmp/a.id" >"$tmp/a.log" 2>&1 &
a=$!
pids+=("$a")
waitFor 30 "$tmp/a.log" "leads" || fail "replica a never led"
ECCL_DEBUG=INFO "$coord" "${serve[@]}" --listen 127.0.0.1 --id-file "$tmp/b.id" >"$tmp/b.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -s "$tmp/a.id" ] && break; sleep 0.1; done
[ -s "$tmp/a.id" ] || fail "replica a did not make the job"
id=$(cat "$tmp/a.id")

export ECCL_SOCKET_IFNAME=lo ECCL_UNIQUE_ID=$id ECCL_COORD_FAILOVER_MS=15000 ECCL_DEBUG=INFO
ranks=()
for r in 0 1 2 3; do
  ECCL_RANK=$r ECCL_NRANKS=4 "$train" --steps 150 --step-ms 100 >"$tmp/rank$r.log" 2>&1 &
  ranks+=($!)
done
ECCL_ROLE=standby ECCL_NRANKS=4 "$train" --steps 150 --step-ms 100 >"$tmp/standby.log" 2>&1 &
ranks+=($!)
pids+=("${ranks[@]}")
await_formed "$coord" "$tmp/a.id" "$tmp/status.log" || fail "the job did not form under replica a"

cut=$(date +%s.%N)
ip netns exec "$ns" ip route add blackhole "$net.3/32"  # a loses etcd; the members still reach it
for _ in $(seq 150); do [ -s "$tmp/b.id" ] && break; sleep 0.1; done
[ -s "$tmp/b.id" ] || fail "replica b did not take over within 15 s of the cut"
echo "partition: b leads $(awk -v a="$cut" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s after a was cut off from etcd (lease 1 s)"
[ "$(cat "$tmp/b.id")" = "$id" ] || fail "b serves another job"
waitFor 10 "$tmp/a.log" "no longer the job's leader" || fail "a did not stop leading"
kill -0 "$a" 2>/dev/null || fail "a exited instead of standing by"
for r in 0 1 2 3; do waitFor 15 "$tmp/rank$r.log" "resumed with" || fail "rank $r did not resume with b"; done
sleep 1
kill -9 "${ranks[2]}"  # a rank dies under b: the standby takes its place
waitFor 30 "$tmp/standby.log" "standby promoted to rank 2" || fail "the standby did not take rank 2"
"$coord" status --id-file "$tmp/b.id" >"$tmp/status.log" 2>&1
grep -q "epoch 2, 4 ranks" "$tmp/status.log" || fail "b does not hold epoch 2 with the standby in it"
rc=0
for i in 0 1 3 4; do wait "${ranks[$i]}" || rc=$?; done
cat "$tmp"/rank*.log "$tmp/standby.log" "$tmp/a.log" "$tmp/b.log" >"$tmp/all.txt"
[ $rc -eq 0 ] || fail "a rank or the standby failed (exit $rc)"
grep -q "final parameters equal a failure-free run" "$tmp/all.txt" || fail "no checked result"
bad=$(grep -E "coordinator: .* failed: " "$tmp/all.txt" | grep -v "coordinator: rank 2 (" || true)
[ -z "$bad" ] || fail "a member other than the killed rank was declared failed: $bad"
! grep -q "coordinator: .* failed: " "$tmp/a.log" || fail "a declared a member after it was cut off"
echo "coordinator partition: ok"
