#!/usr/bin/env bash
# PyTorch's own distributed test suite (the one shipped in the torch wheel)
# on eccl and on Gloo side by side, every test alone, at 2, 3 and 4 ranks:
# every test Gloo passes must pass on eccl, or be listed with its reason in
# python/tests/torch_suite_known.txt (docs/pytorch.md). Ranks are forked
# from one parent per backend: about 9 minutes on two cores (pass --start
# spawn for upstream's way, several hours). CI runs it at 2 ranks, eccl
# only, against the record of Gloo's passes this script rewrites
# (python/tests/torch_suite_gloo.txt; commit it when the torch pin moves).
#   scripts/torch_suite.sh [torch_suite.py arguments, e.g. --match monitored]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build >/dev/null
export PYTHONPATH=$PWD/build/python ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
exec .venv/bin/python python/tests/torch_suite.py --world-sizes 2,3,4 --batch --start fork \
  --gloo-record python/tests/torch_suite_gloo.txt "$@"
