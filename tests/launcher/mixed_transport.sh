#!/usr/bin/env bash
# One job over both back ends: two "hosts" built from network namespaces on
# one host, two ranks in each. Ranks in the same namespace must talk over
# shared memory (their abstract sockets see each other), ranks in different
# ones over TCP on the veth links (they cannot), all in one communicator
# with ECCL_TRANSPORT=auto; a checked all-to-all connects every pair.
# Fails where namespaces cannot be made (it needs root, as CI has).
set -uo pipefail
launcher=$1 perf=$2
source "$(dirname "$0")/two_hosts.sh"
two_hosts m 214
out=$(ECCL_TRANSPORT=auto ECCL_SOCKET_IFNAME=eccl ECCL_DEBUG=INFO "$launcher" -np 4 --host-list "$ns1,$ns2" \
      --rsh "ip netns exec" --timeout 60 "$perf" -b 1K -e 1M -f 32 -n 3 -w 1 -c 1 2>&1)
rc=$?
echo "$out" | grep -E "is up over|Out of bounds" | tail -20
[ $rc -eq 0 ] || { echo "FAIL: eccl-run exited $rc"; echo "$out" | tail -40; exit 1; }
grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "FAIL: wrong results"; exit 1; }
# Ranks 0 and 2 share the first namespace, 1 and 3 the second. The lower
# member of each pair dials and logs the lane; either side's line counts.
expect() {  # expect RANK_A RANK_B KIND
  grep -qE "^\[$1\] .*lane 0 to peer rank $2 .*is up over $3|^\[$2\] .*lane 0 to peer rank $1 .*is up over $3" <<<"$out" ||
    { echo "FAIL: ranks $1 and $2 are not connected over $3"; exit 1; }
}
expect 0 2 shm
expect 1 3 shm
expect 0 1 tcp
expect 0 3 tcp
expect 2 1 tcp
expect 2 3 tcp
echo "mixed transports: ok"
