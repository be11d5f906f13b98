#!/usr/bin/env bash
# The whole suite: install, build, and run every test three ways:
#   1. Release build, every test (unit, threads, processes, launcher, mpirun, fuzz);
#   2. ASan+UBSan build, every test but the fuzzers (they carry ASan already);
#   3. TSan build, the threaded core (transport and thread-rank tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
jobs=$(nproc)

scripts/build.sh build
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600)

scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=address -DECCL_WITH_FUZZ=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest -j"$jobs" --output-on-failure --timeout 900 -LE mpi)

scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=thread -DECCL_WITH_FUZZ=OFF
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
   ctest -j"$jobs" --output-on-failure --timeout 900 -L threaded)
echo "all suites passed"
