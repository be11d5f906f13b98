#!/usr/bin/env bash
# nccl_failover.sh ECCL_RUN NCCL_FAILOVER PRELOAD: real NCCL under the
# preload shim with one rank killed (tests/net_plugin/nccl_failover.cc).
# Needs a GPU: without one it skips (exit 77) with a one-line reason.
set -euo pipefail
run=$1 program=$2 preload=$3
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "nccl_failover: skipped: no GPU"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# On one host NCCL's own peer-to-peer and shared-memory paths would carry
# the bytes: these put them on the network path, eccl's plugin.
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=eccl
export LD_LIBRARY_PATH="$(dirname "$preload")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
out="$work/out.txt"
rc=0
"$run" -np 2 --timeout 120 --kill-when '1:ready to die' env LD_PRELOAD="$preload" "$program" "$work/id" \
  >"$out" 2>&1 || rc=$?
cat "$out"
# eccl-run's status counts the injected kill as no failure; rank 0 decides.
grep -q "rank 0: ncclCommAbort returned" "$out" || { echo "nccl_failover: rank 0 did not finish (eccl-run status $rc)"; exit 1; }
exit "$rc"
