# Sourced by the multi-host tests: builds two "hosts" from network
# namespaces on one bridge and removes them on exit (and those of killed
# runs before it starts).
#   two_hosts PREFIX OCTET   (sets ns1, ns2 and net=10.OCTET.x; hosts are .11 and .12)
# Fails where namespaces cannot be made (root needed). Inside each host the
# link is ecclv0 and the bridge here is ecclPREFIX..., so ECCL_SOCKET_IFNAME=eccl
# matches both.
two_hosts() {
  local prefix=$1 octet=$2 tag=$$
  source "$(dirname "${BASH_SOURCE[0]}")/stale_netns.sh"
  reap_stale_namespaces
  bridge=eccl$prefix$tag ns1=eccl${prefix}1_$tag ns2=eccl${prefix}2_$tag
  net=10.$octet.$((tag % 200))
  trap 'ip netns del "$ns1" 2>/dev/null; ip netns del "$ns2" 2>/dev/null; ip link del "$bridge" 2>/dev/null' EXIT
  if ! ip netns add "$ns1" 2>/dev/null; then
    echo "FAIL: cannot create network namespaces here (the test needs root and CAP_NET_ADMIN, as CI has)"
    exit 1
  fi
  set -e
  ip netns add "$ns2"
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  local i=1 ns
  for ns in "$ns1" "$ns2"; do
    ip link add "$prefix$i$tag" type veth peer name ecclv0 netns "$ns"
    ip link set "$prefix$i$tag" master "$bridge" up
    ip netns exec "$ns" ip addr add "$net.$((10 + i))/24" dev ecclv0
    ip netns exec "$ns" ip link set ecclv0 up
    ip netns exec "$ns" ip link set lo up
    i=$((i + 1))
  done
  set +e
}
