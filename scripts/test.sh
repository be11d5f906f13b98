#!/usr/bin/env bash
# The whole suite: install, build, and run every test three ways:
#   1. Release build, every test (unit, threads, processes, launcher and
#      chaos, mpirun, fuzz; CUDA tests skip without a GPU), then the main
#      job (scripts/main.sh) while the next build loads both cores;
#   2. ASan+UBSan build, every test but the fuzzers (they carry ASan
#      already) and mpirun (Open MPI's own allocations are not ours);
#   3. TSan build, the threaded core (transport, coordinator client and
#      thread-rank tests) and the multi-process reconfiguration tests;
#   4. a clang build of the library and tools that turns every
#      thread-safety annotation violation into an error.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
jobs=$(nproc)
start=$(date +%s)
stage() { echo "=== $1 ($(( $(date +%s) - start )) s in)"; }

stage "Release: build"
scripts/build.sh build
stage "Release: every test"
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600)

# The README's main job, exactly as a new user runs it, while the
# sanitizer build keeps both cores busy: a demo that passes only on an idle
# machine is broken.
stage "The main job (scripts/main.sh), beside the ASan+UBSan build"
scripts/main.sh >build/main-job.log 2>&1 &
main_job=$!
trap 'kill $main_job 2>/dev/null || true' EXIT
stage "ASan+UBSan: build"
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=address -DECCL_WITH_FUZZ=OFF \
  -DECCL_WITH_CUDA=OFF
if wait $main_job; then
  stage "The main job passed"
  grep -E "^=== |^main:" build/main-job.log
else
  echo "=== The main job (scripts/main.sh) failed; its output:"
  cat build/main-job.log
  exit 1
fi
# The multi-process suites run over each back end in Release; under the
# sanitizers once, over shared memory (the TCP lanes are the same device
# code behind a socket), and every collective at 2 and 3 ranks rather than
# also 4 and 5 (Release runs those): the time budget holds that much. The
# verbs code runs under them in the Soft-RoCE VM through its own tests; the
# multi-process suites over verbs (suites_over_soft_roce) run in Release.
stage "ASan+UBSan: every test (multi-process suites over shared memory)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest -j"$jobs" --output-on-failure --timeout 900 -LE mpi -E '@tcp$|EveryCollectiveEveryCount/[45]@|^suites_over_soft_roce$')

stage "TSan: build (what its tests need: target eccl_tsan_suite)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_SANITIZE=thread -DECCL_WITH_FUZZ=OFF \
  -DECCL_WITH_CUDA=OFF >build-tsan.configure.log 2>&1 || { cat build-tsan.configure.log; exit 1; }
ninja -C build-tsan -j"$jobs" eccl_tsan_suite
stage "TSan: threaded core"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest -j"$jobs" --output-on-failure --timeout 900 -L 'threads|unit')
stage "TSan: the NCCL net plugin (its engine under the device's threads; the two newest versions; under a job; the shim's table)"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest -j"$jobs" --output-on-failure --timeout 900 -L net_plugin -R '/v1[12]( |$)|PluginUnderAJob|CommWatch|Pool\.')
stage "TSan: multi-process reconfiguration (one at a time: TSan's slowdown on two cores)"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest -j1 --output-on-failure --timeout 900 -L reconfig -E '@tcp$')

stage "Clang: thread-safety analysis"
cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DECCL_WITH_CUDA=OFF -DECCL_WITH_FUZZ=OFF >build-clang.configure.log 2>&1 || { cat build-clang.configure.log; exit 1; }
ninja -C build-clang -j"$jobs" eccl eccl-run ecclcoord nccl-net-eccl eccl-preload
stage "done"
echo "all suites passed"
