#!/usr/bin/env bash
# Coordinator chaos, the long form (CI runs 5 leader kills as the
# eccl_run_etcd_test test): a real three-node etcd cluster, eccl-run --etcd
# with three coordinator replicas, the leading one SIGKILLed LEADERS times
# while RANKS ranks are killed and replaced by standbys, every allreduce
# checked element by element; ROUNDS such jobs.
#   scripts/coord_chaos.sh [LEADERS] [RANKS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
leaders=${1:-20} ranks=${2:-10} rounds=${3:-1}
scripts/setup.sh
scripts/build.sh build >/dev/null
for round in $(seq 1 "$rounds"); do
  echo "coordinator chaos round $round of $rounds: $leaders leaders and $ranks ranks killed"
  ECCL_COORD_CHAOS_KILLS=$leaders ECCL_RANK_CHAOS_KILLS=$ranks build/tests/eccl_run_etcd_test
done
