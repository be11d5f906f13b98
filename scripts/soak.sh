#!/usr/bin/env bash
# The long chaos soak (CI runs a 100-kill version as the eccl_run_chaos test):
#   scripts/soak.sh [RANKS] [KILLS] [MS] [ROUNDS] [TRANSPORTS]
# builds, then runs ROUNDS chaos jobs with fresh seeds over each back end in
# TRANSPORTS (default "tcp shm", each forced with ECCL_TRANSPORT); stops at
# the first failure and prints its seed so it can be replayed with
# ECCL_TRANSPORT=... tests/launcher/chaos.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8} kills=${2:-1000} ms=${3:-80} rounds=${4:-5} transports=${5:-tcp shm}
scripts/setup.sh
scripts/build.sh build
for transport in $transports; do
  for round in $(seq 1 "$rounds"); do
    seed=$((RANDOM * 32768 + RANDOM))
    echo "soak round $round of $rounds over $transport"
    ECCL_TRANSPORT=$transport \
      tests/launcher/chaos.sh build/bootstrap/eccl-run build/tests/chaos_worker "$n" "$kills" "$ms" "$seed"
  done
  echo "soak: $rounds rounds of $kills kills on $n ranks passed over $transport"
done
