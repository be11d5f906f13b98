#!/usr/bin/env bash
# The main job: install, build, then the elastic demo (4 ranks and a
# standby; rank 2 is killed mid-run, the standby takes its rank, training
# goes on and ends bit-identical to a failure-free run), then the
# all_reduce_perf table over 4 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
build/bootstrap/eccl-run -np 4 --standby 1 --kill 2@1.5 --timeout 300 build/perf/elastic_train --steps 30
exec build/bootstrap/eccl-run -np 4 --timeout 600 build/perf/all_reduce_perf -b 8 -e 64M -f 4 -n 10 -w 3 -c 1
