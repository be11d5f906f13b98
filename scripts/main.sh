#!/usr/bin/env bash
# The main job: install, build, then all_reduce_perf over 4 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
exec build/bootstrap/eccl-run -np 4 --timeout 600 build/perf/all_reduce_perf -b 8 -e 64M -f 4 -n 10 -w 3 -c 1
