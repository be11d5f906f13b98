# Sourced by the tests that make network namespaces. A run killed by SIGKILL
# (ctest's timeout, a person stopping the suite) runs no trap, and what it
# left behind breaks the next run: its bridge and veths carry addresses on
# links named eccl*, which ECCL_SOCKET_IFNAME=eccl then picks. Every name these
# tests make ends in the pid of the script that made it, so one whose script
# no longer runs is removed; a run beside this one (ctest -j) is left alone.
reap_stale_namespaces() {
  local name owner
  for name in $(ip netns list 2>/dev/null | awk '/^eccl/ {print $1}'); do
    owner=${name##*[!0-9]}
    [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null && ip netns del "$name" 2>/dev/null
  done
  for name in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep '^eccl'); do
    owner=${name##*[!0-9]}
    [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null && ip link del "$name" 2>/dev/null
  done
  return 0
}
