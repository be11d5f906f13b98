#!/usr/bin/env bash
# scripts/hardware.sh [STAGE...]: every check that needs hardware this
# machine may not have (a GPU, 16 cores), in stages that each finish well
# inside ten minutes, so a lent machine runs them one command at a time:
#   build     configure and build what the others need (build-hw/)
#   cuda      the CUDA tests: MoE kernels and device reductions against
#             their CPU references
#   dispatch  dispatch_perf: CUDA permute/combine against a device copy
#             and HBM, and the CPU sections
#   reconfig  reconfig_perf --sizes 4,8, ranks pinned to distinct cores
#   logs      sendrecv_perf plain against --log, and log_perf's replay
#   device    device collectives against the host path (2-4 ranks on the
#             GPU), and device_perf: the stream-path allreduce against
#             NCCL (one GPU per rank) and against eccl's host path
#   nccl      real NCCL over eccl's net plugin against NCCL's own sockets
#             (2 ranks on the GPU, one NCCL_HOSTID each, alternating runs),
#             pooled re-creation, and the preload shim with a rank killed
#   snapshots snapshot_perf with cores to spare (issue 26's >= 0.9x: a
#             4 MiB and a 64 KiB allreduce while 64 MiB-1 GiB replicate) and
#             sandbox_record_perf with an eager standby (the GPU snapshot
#             test is in `device`)
# No stage: all of them. Everything measured goes under $OUT (or
# hardware-out/), with a dated report, report-<UTC time>.md, whose figures
# go to docs/hardware.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-hardware-out}
mkdir -p "$out"
build=${ECCL_HW_BUILD:-build-hw}
report="$out/report-$(date -u +%Y%m%dT%H%M%SZ).md"
export ECCL_SOCKET_IFNAME=${ECCL_SOCKET_IFNAME:-lo}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build cuda dispatch reconfig logs device nccl snapshots)

note() { echo "$*" | tee -a "$report"; }
section() { note ""; note "## $1 ($(date -u +%T) UTC)"; }
# Runs a command with its output kept in $out/NAME.txt and shown in the report.
record() {
  local name=$1
  shift
  note ""
  note "\`$*\`"
  note '```'
  local rc=0
  "$@" >"$out/$name.txt" 2>&1 || rc=$?
  tail -n 60 "$out/$name.txt" | tee -a "$report"
  note '```'
  if [ $rc -ne 0 ]; then
    note "**exit status $rc** (full output: $name.txt)"
    failures=$((failures + 1))
  fi
  return 0
}
failures=0

note "# eccl hardware report, $(date -u +%Y-%m-%d) $(hostname)"
note ""
note "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "- cores: $(nproc); memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
if command -v nvidia-smi >/dev/null; then
  note "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | paste -sd ';')"
else
  note "- GPU: none (nvidia-smi not found)"
fi

for stage in "${stages[@]}"; do
  case $stage in
    build)
      section build
      targets=(eccl eccl-run ecclcoord dispatch_perf reconfig_perf sendrecv_perf log_perf all_reduce_perf snapshot_perf
        sandbox_record_perf)
      record configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DECCL_WITH_FUZZ=OFF
      grep -E '^-- eccl' "$out/configure.txt" | tee -a "$report" || true
      if grep -q 'kernels for sm' "$out/configure.txt"; then
        targets+=(moe_cuda_test reduce_cuda_test device_collectives_test)
        grep -q 'device_perf .* is not built' "$out/configure.txt" ||
          targets+=(device_perf nccl_net_perf nccl_failover nccl-net-eccl eccl-preload)
      fi
      record build ninja -C "$build" -j"$(nproc)" "${targets[@]}"
      ;;
    cuda)
      section "CUDA tests"
      for t in moe_cuda_test reduce_cuda_test; do
        if [ -x "$build/tests/$t" ]; then
          record "$t" "$build/tests/$t" --gtest_output="xml:$out/$t.xml"
        else
          note "$t: not built (no CUDA compiler at configure time)"
        fi
      done
      ;;
    snapshots)
      section "snapshot_perf (target: allreduce busbw while a snapshot replicates >= 0.9x alone, with cores to spare)"
      run=("$build/bootstrap/eccl-run" --bind-cores -np 2 --timeout 500)
      record snapshot_perf_4m "${run[@]}" "$build/perf/snapshot_perf" --sizes 67108864,268435456,1073741824 --rounds 3
      record snapshot_perf_64k "${run[@]}" "$build/perf/snapshot_perf" --sizes 67108864,268435456 \
        --allreduce-bytes 65536 --rounds 3
      section "sandbox_record_perf (an eager standby's recording: cost to the job's step)"
      record sandbox_record_perf env ECCL_PREPARE=eager "$build/bootstrap/eccl-run" -np 3 --standby 1 --timeout 300 \
        "$build/perf/sandbox_record_perf"
      ;;
    dispatch)
      section "dispatch_perf (target: CUDA permute/combine >= 0.7x of a device-to-device copy)"
      record dispatch_perf "$build/perf/dispatch_perf" --ranks 4 --no-e2e
      record dispatch_perf_json "$build/perf/dispatch_perf" --ranks 4 --no-e2e --json
      ;;
    reconfig)
      section "reconfig_perf --sizes 4,8 (targets: downtime(8)/downtime(4) <= 2, >= 20x below full init, interference <= 5%)"
      record reconfig_perf "$build/perf/reconfig_perf" --sizes 4,8 --bind-cores --launcher "$build/bootstrap/eccl-run"
      ;;
    logs)
      section "boundary-send log (targets: --log >= 95% of plain busbw; replay >= 90% of plain sends)"
      run=("$build/bootstrap/eccl-run" --bind-cores -np 2 --timeout 300)
      record sendrecv_plain "${run[@]}" "$build/perf/sendrecv_perf" -b 64K -e 64M -f 4 -n 50 -w 5
      record sendrecv_log "${run[@]}" "$build/perf/sendrecv_perf" -b 64K -e 64M -f 4 -n 50 -w 5 --log
      record log_perf "${run[@]}" "$build/perf/log_perf"
      ;;
    device)
      section "device-buffer allreduce: eccl's stream path against NCCL and against eccl's host path"
      if [ -x "$build/tests/device_collectives_test" ]; then
        record device_collectives_test "$build/tests/device_collectives_test" \
          --gtest_output="xml:$out/device_collectives_test.xml"
      else
        note "device_collectives_test: not built (no CUDA compiler at configure time)"
      fi
      if [ -x "$build/perf/device_perf" ]; then
        gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
        # Two ranks share the GPU; NCCL runs only where each rank has its own.
        record device_perf_2ranks "$build/bootstrap/eccl-run" -np 2 --timeout 300 "$build/perf/device_perf" \
          -b 8 -e 256M -f 8 -n 20 -w 5
        if [ "${gpus:-0}" -ge 2 ]; then
          record device_perf_allgpus "$build/bootstrap/eccl-run" -np "$gpus" --timeout 300 "$build/perf/device_perf" \
            -b 8 -e 256M -f 8 -n 20 -w 5
        else
          note "one GPU: NCCL (one GPU per rank) is compared only where there are several"
        fi
      else
        note "device_perf: not built (needs CUDA and NCCL at configure time)"
      fi
      ;;
    nccl)
      section "NCCL over eccl's net plugin (targets: busbw >= 0.9x NCCL's sockets; pooled re-creation >= 10x faster; a killed rank reported within 2 s)"
      if [ -x "$build/perf/nccl_net_perf" ]; then
        # Both transports on the network path: NCCL's own P2P and SHM are off,
        # and each rank is its own host. Alternating runs, three each.
        common=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo)
        plugin=("${common[@]}" NCCL_NET_PLUGIN=eccl NCCL_NET=eccl LD_LIBRARY_PATH="$(cd "$build/net_plugin" && pwd)")
        socket=("${common[@]}" NCCL_NET_PLUGIN=none NCCL_NET=Socket)
        args=(-b 64K -e 128M -f 4 -n 20 -w 5 --recreate 5 --distinct-hosts)
        for i in 1 2 3; do
          record "nccl_plugin_$i" "$build/bootstrap/eccl-run" -np 2 --timeout 300 "${plugin[@]}" \
            "$build/perf/nccl_net_perf" "${args[@]}" --label eccl-plugin
          record "nccl_socket_$i" "$build/bootstrap/eccl-run" -np 2 --timeout 300 "${socket[@]}" \
            "$build/perf/nccl_net_perf" "${args[@]}" --label nccl-socket
        done
        record nccl_failover tests/net_plugin/nccl_failover.sh "$build/bootstrap/eccl-run" \
          "$build/tests/nccl_failover" "$build/net_plugin/libeccl-preload.so"
        # DDP under the shim, where this machine has torch (python3, or .venv's).
        py=python3
        [ -x .venv/bin/python ] && py=.venv/bin/python
        if "$py" -c "import torch" 2>/dev/null; then
          rdv=$(mktemp -u)
          record ddp_failover "$build/bootstrap/eccl-run" -np 2 --timeout 180 --kill-when '1:ready to die' \
            "${plugin[@]}" LD_PRELOAD="$(cd "$build/net_plugin" && pwd)/libeccl-preload.so" \
            "$py" tests/net_plugin/ddp_failover.py "$rdv"
        else
          note "ddp_failover: not run (no torch on this machine)"
        fi
      else
        note "nccl_net_perf: not built (needs CUDA and NCCL at configure time)"
      fi
      ;;
    *)
      echo "hardware.sh: unknown stage '$stage' (build cuda dispatch reconfig logs device nccl snapshots)" >&2
      exit 2
      ;;
  esac
done
note ""
note "report: $report; $failures command(s) failed"
[ "$failures" -eq 0 ]
