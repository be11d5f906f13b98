#!/usr/bin/env bash
# Every rank of a job dead: the standbys --respawn or --refill started for
# them have nobody left to promote them, so eccl-run releases them and
# ends, starting no more (it used to keep them, or start new ones after
# the release, until --timeout: an ETTR run whose ranks all failed took
# fifteen minutes to report it).
#   respawn_ends.sh ECCL_RUN ELASTIC_TRAIN
set -euo pipefail
run=${1:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
train=${2:?usage: $0 ECCL_RUN ELASTIC_TRAIN}
# shellcheck source=job_output.sh
source "$(dirname "$0")/job_output.sh"
for pool in "--respawn 0" "--standby 1 --refill"; do
  start=$(date +%s)
  # shellcheck disable=SC2086
  ECCL_SOCKET_IFNAME=lo "$run" -np 2 $pool --kill 0@1.5 --kill 1@1.5 --timeout 60 \
    "$train" --steps 100000 --size 1024 --step-ms 10 >"$out" 2>&1 || true
  took=$(($(date +%s) - start))
  standbys=$(grep -c "ECCL_ROLE=standby\|standby s[0-9]" "$out" || true)
  if [ "$took" -ge 45 ] || grep -q -- "--timeout of" "$out"; then
    echo "respawn_ends: eccl-run $pool with every rank killed took $took s:" >&2
    cat "$out" >&2
    exit 1
  fi
  echo "respawn_ends: eccl-run $pool with every rank killed ended after $took s"
done
