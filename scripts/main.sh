#!/usr/bin/env bash
# The main job: install, build, then the elastic demo (4 ranks and a
# standby; rank 2 is killed mid-run, the standby takes its rank, training
# goes on and ends bit-identical to a failure-free run), the all_reduce_perf
# table over 4 local ranks, and the same elastic story through PyTorch: DDP
# on the "eccl" backend, a failure-free torchrun run, then a run where rank 2
# is killed and a standby takes over; both print the same parameter hash;
# then torchft's Manager over eccl: a replica group killed, restarted, healed;
# then an MoE language model on eccl's dispatcher (python/examples/
# moe_elastic.py): failure-free, with a standby taking a killed rank's place
# (bit-equal at the end), and with no standby (shrink, re-place, train on).
#
# Each part's whole output goes to build/main/<part>.log; the screen gets
# its key lines. A part that fails stops the job, which names the part and
# shows the end of its log.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
logs=build/main
mkdir -p "$logs"

# part NAME TITLE FILTER COMMAND...: runs COMMAND, keeps its output in
# $logs/NAME.log, shows the lines matching FILTER (everything when FILTER
# is empty); on failure says which part failed and shows the log's end.
part() {
  local name=$1 title=$2 filter=$3
  shift 3
  echo "=== $name: $title"
  local log=$logs/$name.log rc=0
  if [ -z "$filter" ]; then
    "$@" 2>&1 | tee "$log" || rc=$?
  else
    { "$@" 2>&1 || echo "__exit__ $?"; } | tee "$log" | { grep -E "$filter" || true; }
    rc=$(sed -n 's/^__exit__ \([0-9]*\)$/\1/p' "$log" | tail -1)
    rc=${rc:-0}
  fi
  if [ "$rc" -ne 0 ]; then
    echo "main: part '$name' failed (exit $rc); the end of its log ($log):" >&2
    grep -v '^__exit__ ' "$log" | tail -40 | sed 's/^/  | /' >&2
    exit "$rc"
  fi
}

part elastic_demo "4 ranks and a standby, rank 2 killed at 1.5 s" "" \
  build/bootstrap/eccl-run -np 4 --standby 1 --kill 2@1.5 --timeout 300 build/perf/elastic_train --steps 30
part all_reduce_perf "4 local ranks, checked" "" \
  build/bootstrap/eccl-run -np 4 --timeout 600 build/perf/all_reduce_perf -b 8 -e 64M -f 4 -n 10 -w 3 -c 1
if [ ! -d build/python/torch_eccl ]; then
  echo "main: the PyTorch parts need torch_eccl, which this build skipped (see build.configure.log)" >&2
  exit 1
fi
export PYTHONPATH=$PWD/build/python
part ddp_failure_free "DDP on eccl, failure-free (torchrun, 4 ranks)" "done after" \
  .venv/bin/python -m torch.distributed.run --nproc-per-node 4 python/examples/ddp_elastic.py --steps 150 --step-ms 0
part ddp_rank_killed "DDP on eccl under eccl-run: 4 ranks and a standby, rank 2 killed mid-run" "failed:|recovered|joined|done after|eccl-run" \
  env ECCL_SOCKET_IFNAME=lo build/bootstrap/eccl-run -np 4 --standby 1 --kill-when "2:step 40" --timeout 300 \
  .venv/bin/python python/examples/ddp_elastic.py --steps 150 --step-ms 100
part torchft "3 replica groups under torchft_lighthouse, replica 1 killed mid-allreduce and restarted" "^\[driver\]|^torchft_train|giving up" \
  env ECCL_BUILD_DIR=$PWD/build .venv/bin/python python/examples/torchft_train.py --pg eccl --replicas 3 \
  --steps 160 --kill 1:20 --out build/torchft_train
# moe_run [ECCL-RUN ARGS...] [-- EXAMPLE ARGS...]
moe_run() {
  local launcher=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  env ECCL_SOCKET_IFNAME=lo build/bootstrap/eccl-run -np 4 "${launcher[@]}" --timeout 300 .venv/bin/python \
    python/examples/moe_elastic.py --steps 60 --out "$logs/moe_${name_of_run}.json" "$@"
}
moe_filter="failed:|recovered|joined|re-placed|restored from|first step after|done after|eccl-run"
name_of_run=base part moe_failure_free "MoE LM on eccl's dispatcher, 4 ranks, failure-free" "$moe_filter" moe_run
name_of_run=standby part moe_standby "MoE: rank 2 killed, a standby takes its rank" "$moe_filter" \
  moe_run --standby 1 --kill-when "2:step 30"
name_of_run=shrink part moe_shrink "MoE: rank 2 killed, no standby: shrink to 3, re-place, train on" "$moe_filter" \
  moe_run --kill-when "2:step 30"
# One replica of the cold experts, no re-placement from the load: rank 3
# holds the only replicas of experts 0 and 1, which come back from the
# snapshot copies rank 0 holds.
name_of_run=lost part moe_lost "MoE: rank 3 killed with the only replicas of two experts: back from the snapshot" \
  "$moe_filter" moe_run --kill-when "3:step 30" -- --min-replicas 1 --rebalance 0
part moe_compare "MoE: the standby run bit-equal, the shrunk runs' losses beside the failure-free one" "" \
  .venv/bin/python python/examples/moe_elastic.py --compare "$logs/moe_base.json" "$logs/moe_standby.json" \
  "$logs/moe_shrink.json" "$logs/moe_lost.json"
echo "main: every part passed (logs in $logs)"
