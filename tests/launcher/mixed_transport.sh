#!/usr/bin/env bash
# One job over both back ends: two "hosts" built from network namespaces on
# one host, two ranks in each. Ranks in the same namespace must talk over
# shared memory (their abstract sockets see each other), ranks in different
# ones over TCP on the veth links (they cannot), all in one communicator
# with ECCL_TRANSPORT=auto; a checked all-to-all connects every pair.
# Exit 77 (skipped) where namespaces cannot be made.
set -uo pipefail
launcher=$1 perf=$2
tag=$$
bridge=ecclm$tag ns1=ecclm1_$tag ns2=ecclm2_$tag
cleanup() {
  ip netns del "$ns1" 2>/dev/null
  ip netns del "$ns2" 2>/dev/null
  ip link del "$bridge" 2>/dev/null
}
trap cleanup EXIT
if ! ip netns add "$ns1" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and CAP_NET_ADMIN)"
  exit 77
fi
set -e
ip netns add "$ns2"
ip link add "$bridge" type bridge
ip addr add 10.214.$((tag % 200)).1/24 dev "$bridge"
ip link set "$bridge" up
i=1
for ns in "$ns1" "$ns2"; do
  ip link add "mv$i$tag" type veth peer name ecclv0 netns "$ns"
  ip link set "mv$i$tag" master "$bridge" up
  ip netns exec "$ns" ip addr add 10.214.$((tag % 200)).$((10 + i))/24 dev ecclv0
  ip netns exec "$ns" ip link set ecclv0 up
  ip netns exec "$ns" ip link set lo up
  i=$((i + 1))
done
set +e
out=$(ECCL_TRANSPORT=auto ECCL_SOCKET_IFNAME=eccl ECCL_DEBUG=INFO "$launcher" -np 4 --host-list "$ns1,$ns2" \
      --rsh "ip netns exec" --timeout 60 "$perf" -b 1K -e 1M -f 32 -n 3 -w 1 -c 1 2>&1)
rc=$?
echo "$out" | grep -E "is up over|Out of bounds" | tail -20
[ $rc -eq 0 ] || { echo "FAIL: eccl-run exited $rc"; echo "$out" | tail -40; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong results"; exit 1; }
# Ranks 0 and 2 share the first namespace, 1 and 3 the second. The lower
# member of each pair dials and logs the lane; either side's line counts.
expect() {  # expect RANK_A RANK_B KIND
  echo "$out" | grep -qE "^\[$1\] .*lane 0 to peer rank $2 .*is up over $3|^\[$2\] .*lane 0 to peer rank $1 .*is up over $3" ||
    { echo "FAIL: ranks $1 and $2 are not connected over $3"; exit 1; }
}
expect 0 2 shm
expect 1 3 shm
expect 0 1 tcp
expect 0 3 tcp
expect 2 1 tcp
expect 2 3 tcp
echo "mixed transports: ok"
