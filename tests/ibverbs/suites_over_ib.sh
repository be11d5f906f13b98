#!/usr/bin/env bash
# The multi-process suites with every lane over verbs, run inside the
# Soft-RoCE VM (scripts/rdma-vm.sh boots it once for all of them):
#
#   scripts/rdma-vm.sh -- tests/ibverbs/suites_over_ib.sh BUILD_TESTS_DIR
#
# Every collective at 2 and 4 ranks up to 16 MiB, the elastic suites
# (replace with lazy and eager standbys, shrink, grow, migration, named
# reconfiguration, with lane and queue-pair counts asserted; SIGSTOP),
# faults (kill, a wrong secret, a missing rank), call signatures, pipeline logs and the MoE
# dispatcher. The 16-rank elastic case stays on the host: seventeen
# processes on two emulated CPUs are a test of the emulator.
set -u
dir=${1:?usage: $0 BUILD_TESTS_DIR}
[ -n "${ECCL_RDMA_VM:-}" ] || { echo "suites_over_ib: run me inside scripts/rdma-vm.sh" >&2; exit 2; }
export ECCL_TRANSPORT=ib ECCL_SOCKET_IFNAME=lo ECCL_TEST_LARGEST_COUNT=$((4 << 20))
failed=()
run() {
  local binary=$1 filter=$2 start=$SECONDS
  echo "=== $binary --gtest_filter=$filter"
  if timeout -k 5 400 "$dir/$binary" --gtest_filter="$filter" --gtest_brief=1; then
    echo "=== $binary: passed in $((SECONDS - start)) s"
  else
    echo "=== $binary: FAILED (exit $?) after $((SECONDS - start)) s"
    failed+=("$binary")
  fi
}
run collectives_test '*/0:*/2'
run elastic_test '-*/1'
run reconfigure_test '*'
run joining_test '*'
run named_reconfigure_test '*'
# StoppedRankIsCaughtByTheTimeout stops its victim 600 ms after the start,
# before an emulated rank under a loaded host has joined (init then times
# out); a stopped member over ib is Elastic.AStoppedMemberIsFenced... above.
run faults_test '-Faults.StoppedRankIsCaughtByTheTimeout'
run signature_test '*'
run pipeline_log_test '*'
run moe_test '*'
if [ ${#failed[@]} -gt 0 ]; then
  echo "suites over ib: failed: ${failed[*]}"
  exit 1
fi
echo "suites over ib: all passed in $SECONDS s"
