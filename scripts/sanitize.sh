#!/usr/bin/env bash
# The full sanitizer runs: ASan+UBSan over every test, TSan over the threaded core.
set -euo pipefail
cd "$(dirname "$0")/.."
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
clang=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)  # as scripts/test.sh builds them
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=address -DECCL_WITH_FUZZ=OFF -DECCL_WITH_CUDA=OFF "${clang[@]}"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest -j1 --output-on-failure --timeout 900 -LE mpi)
scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=thread -DECCL_WITH_FUZZ=OFF -DECCL_WITH_CUDA=OFF "${clang[@]}"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest -j1 --output-on-failure --timeout 900 -L 'threads|unit')
