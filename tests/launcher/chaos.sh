#!/usr/bin/env bash
# Chaos: eccl-run kills a random rank every ~MS ms (KILLS times) while the
# standby pool is refilled; chaos_worker checks every allreduce and recovers
# each time. Passes only if the job ends by itself (no hang), every process
# that was not killed exits 0 (no wrong result) and every kill happened.
#   chaos.sh ECCL_RUN CHAOS_WORKER NRANKS KILLS MS [SEED]
# A failed run's whole output is kept as chaos-SEED.log in the working
# directory (the test's build folder).
set -uo pipefail
run=$1 worker=$2 n=$3 kills=$4 ms=$5 seed=${6:-$RANDOM}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "chaos: $n ranks, $kills kills every ~$ms ms, seed $seed"
# Kills are seen by their closed connections, not by the heartbeat: its
# timeout only has to outlast a stall. At 2 s, a run under ASan beside the
# main job and two busy loops fenced a live promoted rank: its channel to
# the coordinator was reset and the launcher (the coordinator's process)
# killed it 2.2 s later, where it polls every 100 ms: signs of a stall of
# about that length (the run's whole output was not kept to tell more).
ECCL_HEARTBEAT_MS=100 ECCL_HEARTBEAT_TIMEOUT_MS=6000 ECCL_TIMEOUT_MS=20000 \
  "$run" -np "$n" --standby 2 --refill --chaos "$ms" --chaos-max "$kills" --seed "$seed" \
  --timeout $((kills * ms / 1000 * 4 + 120)) "$worker" --min-epoch 2 --quiet-ms 2000 > "$out" 2>&1
rc=$?
grep -E "chaos killed|chaos_worker:" "$out"
if [ $rc -ne 0 ] || ! grep -q "chaos killed $kills processes" "$out" || ! grep -q "allreduces checked" "$out"; then
  cp "$out" "chaos-$seed.log"
  echo "FAIL (exit $rc, seed $seed); the whole output: $PWD/chaos-$seed.log; last lines:"
  tail -60 "$out"
  exit 1
fi
echo "chaos: ok"
