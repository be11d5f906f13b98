#!/usr/bin/env bash
# The main job: install, build, then the elastic demo (4 ranks and a
# standby; rank 2 is killed mid-run, the standby takes its rank, training
# goes on and ends bit-identical to a failure-free run), the all_reduce_perf
# table over 4 local ranks, and the same elastic story through PyTorch: DDP
# on the "eccl" backend, a failure-free torchrun run, then a run where rank 2
# is killed and a standby takes over; both print the same parameter hash;
# then torchft's Manager over eccl: a replica group killed, restarted, healed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
build/bootstrap/eccl-run -np 4 --standby 1 --kill 2@1.5 --timeout 300 build/perf/elastic_train --steps 30
build/bootstrap/eccl-run -np 4 --timeout 600 build/perf/all_reduce_perf -b 8 -e 64M -f 4 -n 10 -w 3 -c 1
if [ -d build/python/torch_eccl ]; then
  export PYTHONPATH=$PWD/build/python
  echo "=== DDP on eccl, failure-free (torchrun, 4 ranks)"
  .venv/bin/python -m torch.distributed.run --nproc-per-node 4 python/examples/ddp_elastic.py --steps 150 --step-ms 0 \
    2>&1 | grep -E "done after"
  echo "=== DDP on eccl under eccl-run: 4 ranks and a standby, rank 2 killed mid-run"
  ECCL_SOCKET_IFNAME=lo build/bootstrap/eccl-run -np 4 --standby 1 --kill-when "2:step 40" --timeout 300 \
    .venv/bin/python python/examples/ddp_elastic.py --steps 150 --step-ms 100 2>&1 |
    grep -E "failed:|recovered|joined|done after|eccl-run"
  echo "=== torchft over eccl: 3 replica groups under torchft_lighthouse, replica 1 killed mid-allreduce and restarted"
  ECCL_BUILD_DIR=$PWD/build .venv/bin/python python/examples/torchft_train.py --pg eccl --replicas 3 --steps 160 \
    --kill 1:20 --out build/torchft_train 2>&1 | grep -E "^\[driver\]|^torchft_train"
fi
