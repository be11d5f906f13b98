#!/usr/bin/env bash
# Two "hosts" built from network namespaces on one bridge: eccl-run places
# ranks on them through a remote shell (`ip netns exec` stands in for ssh),
# the coordinator stays in the root namespace, and a checked allreduce runs
# over the veth links. Exit 77 (skipped) where namespaces cannot be made.
set -uo pipefail
launcher=$1 perf=$2
tag=$$
bridge=ecclb$tag ns1=ecclh1_$tag ns2=ecclh2_$tag
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
ip addr add 10.213.$((tag % 200)).1/24 dev "$bridge"
ip link set "$bridge" up
i=1
for ns in "$ns1" "$ns2"; do
  ip link add "ev$i$tag" type veth peer name ecclv0 netns "$ns"
  ip link set "ev$i$tag" master "$bridge" up
  ip netns exec "$ns" ip addr add 10.213.$((tag % 200)).$((10 + i))/24 dev ecclv0
  ip netns exec "$ns" ip link set ecclv0 up
  ip netns exec "$ns" ip link set lo up
  i=$((i + 1))
done
set +e
# "eccl" matches the bridge here and ecclv0 inside each namespace.
out=$(ECCL_SOCKET_IFNAME=eccl ECCL_DEBUG=INFO "$launcher" -np 4 --host-list "$ns1,$ns2" --rsh "ip netns exec" \
      --timeout 60 "$perf" -b 1K -e 4M -f 16 -n 3 -w 1 -c 1 2>&1)
rc=$?
echo "$out" | grep -v "^\[.\] .*INFO" | tail -20
[ $rc -eq 0 ] || { echo "FAIL: eccl-run exited $rc"; echo "$out" | tail -40; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong results"; exit 1; }
net=10.213.$((tag % 200))
# Ranks 0 and 2 on the first host, 1 and 3 on the second, each on its veth.
for r in 0 2; do
  echo "$out" | grep -qE "^\[$r\] .*listening on $net\.11:" || { echo "FAIL: rank $r is not on host 1"; exit 1; }
done
for r in 1 3; do
  echo "$out" | grep -qE "^\[$r\] .*listening on $net\.12:" || { echo "FAIL: rank $r is not on host 2"; exit 1; }
done
echo "multihost: ok"
