#!/usr/bin/env bash
# The whole suite: install, build, and run every test three ways:
#   1. Release build, every test (unit, threads, processes, launcher and
#      chaos, mpirun, fuzz, the GPU bundle; CUDA tests skip without a GPU);
#      PyTorch's tests and the ETTR runs in the background through the
#      later stages;
#   2. ASan+UBSan build (clang), every test but the fuzzers (they carry
#      ASan already) and mpirun (Open MPI's own allocations are not ours),
#      with the main job (scripts/main.sh) beside them;
#   3. TSan build (clang), the threaded core (transport, coordinator client
#      and thread-rank tests), the net plugin and the multi-process
#      reconfiguration tests. clang's thread-safety analysis runs in that
#      build over the library, the tools, the net plugin and the shim: an
#      annotation violation fails it.
# The sanitized trees build in the background at the lowest priority while
# the previous stage's tests run: the tests leave a third of two cores idle
# (waiting on peers, timeouts and processes starting), and the build takes
# only that.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
jobs=$(nproc)
start=$(date +%s)
stage() { echo "=== $1 ($(( $(date +%s) - start )) s in)"; }
# The test logs the end of this script digests: none left from a run before.
rm -f build/release-tests.log build-asan/asan-tests.log build-tsan/tsan-tests.log

# clang_tree DIR [TARGET...] -- CMAKE-ARG...: configures and builds a
# sanitized tree with clang, which compiles this code under the sanitizers
# in half to four fifths of gcc's time (a test file 10.8 s against 21.9 s).
clang_tree() {
  local dir=$1 targets=()
  shift
  while [ "$1" != -- ]; do targets+=("$1"); shift; done
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECCL_WITH_FUZZ=OFF -DECCL_WITH_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "$@" && ninja -C "$dir" -j"$jobs" "${targets[@]}"
}
# in_background LOG COMMAND...: runs COMMAND at nice 19, its output in LOG.
background=()
in_background() {
  local log=$1
  shift
  ( renice -n 19 "$BASHPID" >/dev/null; "$@" ) >"$log" 2>&1 &
  background+=($!)
}
# normal_priority PID: PID and everything under it back to nice 0. A build
# that runs at nice 19 beside tests becomes the critical path once awaited:
# beside any other busy process (a user's, CI's neighbour) it would get
# almost no CPU at 19 (the ASan build made 21 of 237 steps in 40 minutes
# beside two busy loops). Without the privilege to raise it, it stays.
normal_priority() {
  renice -n 0 -p "$1" >/dev/null 2>&1 || true
  local child
  for child in $(pgrep -P "$1"); do normal_priority "$child"; done
}
# await PID LOG WHAT: the background job's status; its log's end on failure.
await() {
  normal_priority "$1"
  if ! wait "$1"; then
    echo "=== $3 failed; the end of $2:"
    tail -60 "$2"
    return 1
  fi
}
# A failed stage is recorded and the others still run (a build's failure
# skips only the tests that need it): one CI run names every failure, and
# a flake in one stage hides nothing behind it.
failed=()
check() {
  local what=$1
  shift
  if ! "$@"; then
    echo "=== FAILED: $what"
    failed+=("$what")
  fi
}
trap 'kill "${background[@]}" 2>/dev/null || true' EXIT

stage "Release: build"
scripts/build.sh build
stage "Release: every test but PyTorch's (the ASan+UBSan tree builds beside, at nice 19)"
in_background build-asan.log clang_tree build-asan -- -DECCL_SANITIZE=address
asan_build=$!
# PyTorch's tests and the ETTR runs go one at a time (their lock) and use
# under half a core: waiting on peers, timeouts and processes starting.
# Run in the Release stage alone they made it 36 minutes with a core idle
# for most of them; started here, they run on through the sanitized stages
# and are awaited at the end.
(cd build && ctest -j2 -L torch --output-on-failure --timeout 600) >build/torch-tests.log 2>&1 &
torch_tests=$!
background+=($torch_tests)
release_tests() { (cd build && ctest -j"$jobs" -LE torch --output-on-failure --timeout 600) | tee build/release-tests.log; }
check "Release tests" release_tests
stage "ASan+UBSan: the rest of the build"
asan_built=true
await $asan_build build-asan.log "The ASan+UBSan build" || { failed+=("ASan+UBSan build"); asan_built=false; }

# The README's main job, exactly as a new user runs it, beside the
# sanitized tests and build: a demo that passes only on an idle machine is
# broken.
stage "ASan+UBSan: every test, the main job (scripts/main.sh) beside; the TSan tree builds at nice 19"
scripts/main.sh >build/main-job.log 2>&1 &
main_job=$!
background+=($main_job)
# One clang build serves TSan and the thread-safety analysis (every layer
# compiles with -Werror=thread-safety under clang): what the TSan tests
# need, and the library, tools, plugin and shim they do not.
in_background build-tsan.log clang_tree build-tsan eccl_tsan_suite eccl eccl-run ecclcoord nccl-net-eccl eccl-preload \
  -- -DECCL_SANITIZE=thread
tsan_build=$!
# The multi-process suites run over each back end in Release; under the
# sanitizers once, over shared memory (the TCP lanes are the same device
# code behind a socket), and every collective at 2 and 3 ranks rather than
# also 4 and 5 (Release runs those): the time budget holds that much. The
# verbs code runs under them in the Soft-RoCE VM through its own tests; the
# multi-process suites over verbs (suites_over_soft_roce) run in Release.
if $asan_built; then
  asan_tests() {
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest -j"$jobs" --output-on-failure --timeout 900 -LE mpi -E '@tcp$|EveryCollectiveEveryCount/[45]@|^suites_over_soft_roce$') |
      tee build-asan/asan-tests.log
  }
  check "ASan+UBSan tests" asan_tests
fi
if wait $main_job; then
  stage "The main job passed"
  grep -E "^=== |^main:" build/main-job.log
else
  echo "=== The main job (scripts/main.sh) failed; its output:"
  cat build/main-job.log
  failed+=("the main job")
fi

stage "TSan + thread-safety analysis: the rest of the clang build"
if await $tsan_build build-tsan.log "The TSan build (or the thread-safety analysis in it)"; then
  tsan_ctest() {
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure --timeout 900 "$@") |
      tee -a build-tsan/tsan-tests.log
  }
  stage "TSan: threaded core"
  check "TSan: threaded core" tsan_ctest -j"$jobs" -L 'threads|unit'
  stage "TSan: the NCCL net plugin (its engine under the device's threads; the two newest versions; under a job; the shim's table)"
  check "TSan: the net plugin" tsan_ctest -j"$jobs" -L net_plugin -R '/v1[12]( |$)|PluginUnderAJob|CommWatch|Pool\.'
  stage "TSan: multi-process reconfiguration (one at a time: TSan's slowdown on two cores)"
  check "TSan: reconfiguration" tsan_ctest -j1 -L reconfig -E '@tcp$'
else
  failed+=("TSan build")
fi

stage "PyTorch's tests and the ETTR runs (started with the Release tests)"
if wait $torch_tests; then
  grep -E "tests passed|Test +#" build/torch-tests.log
else
  echo "=== PyTorch's tests failed; their output:"
  cat build/torch-tests.log
  failed+=("PyTorch's tests")
fi

stage "done"
if [ ${#failed[@]} -gt 0 ]; then
  # Last, where a reader of the output's end (CI keeps the end) sees it:
  # what each failed test printed, its first and last lines.
  echo "=== what each failed test printed"
  for log in build/release-tests.log build-asan/asan-tests.log build-tsan/tsan-tests.log build/torch-tests.log; do
    [ -f "$log" ] && scripts/failed-tests.sh "$log"
  done
  printf '=== failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "all suites passed"
