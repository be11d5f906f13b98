#!/usr/bin/env bash
# Kills a random rank of python/examples/moe_elastic.py at a random step,
# N times (default 50), taking turns: a run with a standby (it must end
# bit-equal to the failure-free run), one without (the survivors shrink,
# re-place and must finish every step with every expert), and one without
# where cold experts have a single replica (--min-replicas 1: the ones
# that die with the rank come back from the peer-memory snapshot). The kill lands
# wherever the rank is when eccl-run sees its step line: in a dispatch, a
# combine, the backward, the replica-gradient sum, or a re-placement's move
# (every 8th step). Each run has a deadline, so a hang fails the soak.
#   scripts/moe_soak.sh [ITERATIONS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=${1:-50}
seed=${2:-$RANDOM}
build=${ECCL_BUILD_DIR:-build}
out=${ECCL_SOAK_DIR:-$build/moe_soak}
mkdir -p "$out"
export PYTHONPATH=$PWD/$build/python ECCL_SOCKET_IFNAME=lo
python=${ECCL_PYTHON:-.venv/bin/python}
steps=24
# example [ECCL-RUN ARGS...] [-- EXAMPLE ARGS...]
example() {
  local launcher=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  timeout 200 "$build/bootstrap/eccl-run" -np 4 "${launcher[@]}" --timeout 180 "$python" python/examples/moe_elastic.py \
    --steps $steps --rebalance 8 --step-ms 0 --print-every 1 --out "$run_out" "$@"
}
run_out=$out/base.json example >"$out/base.log" 2>&1 || { echo "moe_soak: the failure-free run failed ($out/base.log)"; exit 1; }
RANDOM=$seed
failures=0
for i in $(seq 1 "$iterations"); do
  rank=$((RANDOM % 4))
  step=$((1 + RANDOM % (steps - 2)))
  case $((i % 3)) in
    1) mode=standby; extra=(--standby 1); own=() ;;
    2) mode=shrink; extra=(); own=() ;;
    0) mode=lost; extra=(); own=(--min-replicas 1) ;;
  esac
  run_out=$out/run$i.json
  verdict=ok
  if ! example "${extra[@]}" --kill-when "$rank:step $step " -- "${own[@]}" >"$out/run$i.log" 2>&1; then
    verdict="run failed"
  elif ! "$python" python/examples/moe_elastic.py --compare "$out/base.json" "$run_out" >"$out/compare$i.log" 2>&1; then
    verdict="$(tail -1 "$out/compare$i.log")"
  fi
  recovery=$(sed -n 's/.*first step after the failure done \([0-9]*\) ms.*/\1/p' "$out/run$i.log" | sort -n | tail -1)
  restored=$(grep -c "restored from the snapshot" "$out/run$i.log" || true)
  echo "moe_soak $i/$iterations: $mode, rank $rank killed after step $step: $verdict (next step ${recovery:-?} ms" \
    "after detection; $restored expert(s) from a snapshot)"
  [ "$verdict" = ok ] || failures=$((failures + 1))
done
echo "moe_soak: $failures of $iterations runs failed (seed $seed, logs in $out)"
[ "$failures" -eq 0 ]
