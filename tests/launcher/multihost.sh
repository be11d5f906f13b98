#!/usr/bin/env bash
# Two "hosts" built from network namespaces on one bridge: eccl-run places
# ranks on them through a remote shell (`ip netns exec` stands in for ssh),
# the coordinator stays in the root namespace, and a checked allreduce runs
# over the veth links. Fails where namespaces cannot be made (it needs root).
set -uo pipefail
launcher=$1 perf=$2
source "$(dirname "$0")/two_hosts.sh"
two_hosts b 213
# "eccl" matches the bridge here and ecclv0 inside each namespace.
out=$(ECCL_SOCKET_IFNAME=eccl ECCL_DEBUG=INFO "$launcher" -np 4 --host-list "$ns1,$ns2" --rsh "ip netns exec" \
      --timeout 60 "$perf" -b 1K -e 4M -f 16 -n 3 -w 1 -c 1 2>&1)
rc=$?
echo "$out" | grep -v "^\[.\] .*INFO" | tail -20
[ $rc -eq 0 ] || { echo "FAIL: eccl-run exited $rc"; echo "$out" | tail -40; exit 1; }
grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "FAIL: wrong results"; exit 1; }
# Ranks 0 and 2 on the first host, 1 and 3 on the second, each on its veth.
for r in 0 2; do
  grep -qE "^\[$r\] .*listening on $net\.11:" <<<"$out" || { echo "FAIL: rank $r is not on host 1"; exit 1; }
done
for r in 1 3; do
  grep -qE "^\[$r\] .*listening on $net\.12:" <<<"$out" || { echo "FAIL: rank $r is not on host 2"; exit 1; }
done
echo "multihost: ok"
