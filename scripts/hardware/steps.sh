# The stages' bodies for run.sh (sourced): each runs its commands through
# step, which keeps a command inside what is left of its stage's limit.

# step NAME SHOW -- CMD...: runs CMD, its whole output in
# logs/STAGE-NAME.txt. SHOW is what the report gets of it: all (a table
# of figures), gtest (the test binary's summary), tail (the last lines).
# Exit 77 is a skip (the test scripts' convention), 124/137 a timeout.
step() {
  local name=$1 show=$2
  shift 3
  local left=$((stage_deadline - $(date +%s))) log=$logs/$stage-$name.txt rc=0 t0 seconds
  local shown="$*"
  shown=${shown//$B/bundle}
  shown=${shown//$root\//}
  say ""
  if [ "$left" -lt 5 ]; then
    say "\`$shown\`: not started, the stage's time was spent"
    step_timeouts=$((step_timeouts + 1))
    return 1
  fi
  say "\`$shown\`"
  t0=$(date +%s%N)
  timeout -k 5 "$left" "$@" >"$log" 2>&1 || rc=$?
  seconds=$(awk -v ns=$(($(date +%s%N) - t0)) 'BEGIN {printf "%.1f", ns / 1e9}')
  say '```'
  case $show in
    all) head -n 150 "$log" >>"$body" ;;
    gtest) grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|^\[==========\]|tests? skipped|^ *YOU HAVE' "$log" >>"$body" ;;
    tail) tail -n 15 "$log" >>"$body" ;;
  esac
  say '```'
  case $rc in
    0) say "exit 0 after $seconds s" ;;
    77) say "skipped after $seconds s: $(grep -m1 -i 'skip' "$log")" ;;
    124 | 137) say "**timed out** after $seconds s"; step_timeouts=$((step_timeouts + 1)) ;;
    *)
      say "**exit $rc** after $seconds s"
      step_failures=$((step_failures + 1))
      if [ "$show" != all ]; then
        say '```'
        tail -n 30 "$log" >>"$body"
        say '```'
      fi
      ;;
  esac
  return $rc
}

stage_cuda() {
  step moe_cuda_test gtest -- "$B/bin/moe_cuda_test"
  step reduce_cuda_test gtest -- "$B/bin/reduce_cuda_test"
}

stage_device() {
  step device_collectives_test gtest -- "$B/bin/device_collectives_test" --gtest_filter='-DeviceSnapshots.*'
  # Two ranks share the GPU: eccl's stream path against its host path.
  step device_perf_2ranks all -- "$B/bin/eccl-run" -np 2 --timeout 100 "$B/bin/device_perf" -b 8 -e 256M -f 8 -n 20 -w 5
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  if [ "$gpus" -ge 2 ]; then
    step device_perf_allgpus all -- "$B/bin/eccl-run" -np "$gpus" --timeout 100 "$B/bin/device_perf" -b 8 -e 256M -f 8 \
      -n 20 -w 5
  else
    say ""
    say "One GPU: NCCL (one GPU per rank) is compared only where there are several."
  fi
}

stage_nccl() {
  # Both transports on the network path: NCCL's own P2P and SHM are off and
  # each rank is a host of its own (NCCL_HOSTID), so two ranks share the GPU.
  local common=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
  local plugin=("${common[@]}" NCCL_NET_PLUGIN=eccl NCCL_NET=eccl LD_LIBRARY_PATH="$B/lib:$LD_LIBRARY_PATH")
  local socket=("${common[@]}" NCCL_NET_PLUGIN=none NCCL_NET=Socket)
  local args=(-b 64K -e 64M -f 4 -n 20 -w 5 --recreate 5 --distinct-hosts) i
  for i in 1 2 3 4 5; do
    # Keep time for the failover checks after the alternating runs.
    [ $((stage_deadline - $(date +%s))) -gt 60 ] || { say ""; say "Rounds stopped after $((i - 1)): time for the failover checks."; break; }
    step "plugin_$i" all -- "$B/bin/eccl-run" -np 2 --timeout 40 "${plugin[@]}" "$B/bin/nccl_net_perf" "${args[@]}" \
      --label eccl-plugin
    step "socket_$i" all -- "$B/bin/eccl-run" -np 2 --timeout 40 "${socket[@]}" "$B/bin/nccl_net_perf" "${args[@]}" \
      --label nccl-socket
  done
  say ""
  say "Medians over the rounds (busbw GB/s; creation ms):"
  say '```'
  awk -f scripts/hardware/nccl_medians.awk "$logs"/nccl-plugin_*.txt "$logs"/nccl-socket_*.txt >>"$body" 2>&1
  say '```'
  step nccl_failover all -- tests/net_plugin/nccl_failover.sh "$B/bin/eccl-run" "$B/bin/nccl_failover" \
    "$B/lib/libeccl-preload.so"
  if [ -n "$py" ]; then
    step ddp_failover all -- "$B/bin/eccl-run" -np 2 --timeout 90 --kill-when '1:ready to die' "${plugin[@]}" \
      LD_PRELOAD="$B/lib/libeccl-preload.so" "$py" tests/net_plugin/ddp_failover.py "$work/ddp-rendezvous"
  else
    stage_notes="DDP under the shim not run (no torch)"
  fi
}

stage_dispatch() {
  local hbm=()
  case $gpu_name in
    *H200*) hbm=(--hbm-gbs 4800) ;;
    *H100*) hbm=(--hbm-gbs 3350) ;;
  esac
  step dispatch_perf all -- "$B/bin/dispatch_perf" --ranks 4 --no-e2e "${hbm[@]}"
  step dispatch_perf_e2e all -- "$B/bin/dispatch_perf" --ranks 4 --launcher "$B/bin/eccl-run" "${hbm[@]}"
}

stage_gpu_snapshot() {
  step device_snapshots gtest -- "$B/bin/device_collectives_test" --gtest_filter='DeviceSnapshots.*'
}

stage_torch() {
  local tb=$work/torch-build
  step configure tail -- cmake -S python -B "$tb" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DECCL_LIBRARY="$B/lib/libeccl.so.0" -DECCL_INCLUDE_DIR="$B/include" -DECCL_PYTHON="$py" || return
  say '```'
  grep -E '^-- eccl' "$logs/torch-configure.txt" >>"$body"
  say '```'
  step build tail -- ninja -C "$tb" -j"$cores" || return
  step test_cuda tail -- env PYTHONPATH="$tb/python" "$py" -m pytest -q -p no:cacheprovider python/tests/test_cuda.py
}

stage_reconfig() {
  stage_notes=$(cores_note reconfig)
  local args=(--sizes 4,8 --bind-cores)
  [ -z "$stage_notes" ] || args=(--sizes 4 --iterations 5)
  step reconfig_perf all -- "$B/bin/reconfig_perf" "${args[@]}" --launcher "$B/bin/eccl-run"
}

stage_logs() {
  stage_notes=$(cores_note logs)
  local run=("$B/bin/eccl-run" -np 2 --timeout 40) sizes=(-b 64K -e 64M -f 4 -n 50 -w 5) rounds=(--rounds 5)
  if [ -n "$stage_notes" ]; then
    sizes=(-b 64K -e 4M -f 8 -n 10 -w 2) rounds=(--rounds 1 --sizes 1048576)
  else
    run+=(--bind-cores)
  fi
  step sendrecv_plain all -- "${run[@]}" "$B/bin/sendrecv_perf" "${sizes[@]}"
  step sendrecv_log all -- "${run[@]}" "$B/bin/sendrecv_perf" "${sizes[@]}" --log
  step log_perf all -- "${run[@]}" "$B/bin/log_perf" "${rounds[@]}"
}

stage_snapshots() {
  stage_notes=$(cores_note snapshots)
  local run=("$B/bin/eccl-run" -np 2 --timeout 60) sizes=(--sizes 67108864,268435456 --rounds 3) sandbox=()
  if [ -n "$stage_notes" ]; then
    sizes=(--sizes 16777216 --rounds 1) sandbox=(--rounds 1)
  else
    run+=(--bind-cores)
  fi
  step snapshot_4m all -- "${run[@]}" "$B/bin/snapshot_perf" "${sizes[@]}"
  step snapshot_64k all -- "${run[@]}" "$B/bin/snapshot_perf" "${sizes[@]}" --allreduce-bytes 65536
  step sandbox_record all -- env ECCL_PREPARE=eager "$B/bin/eccl-run" -np 3 --standby 1 --timeout 60 \
    "$B/bin/sandbox_record_perf" "${sandbox[@]}"
}

# ECCL_COPY_HELP_BYTES off and on, alternating, five rounds: the 2-core
# development machine cannot tell whether a second thread copying lanes
# pays (there it cost 0.63-0.90x, four threads on two cores).
stage_copyhelp() {
  stage_notes=$(cores_note copyhelp)
  local i help
  for i in 1 2 3 4 5; do
    for help in $([ $((i % 2)) -eq 1 ] && echo "0 262144" || echo "262144 0"); do
      step "help${help}_$i" all -- env ECCL_TRANSPORT=tcp ECCL_NSOCKS_PERPEER=4 ECCL_COPY_HELP_BYTES=$help \
        "$B/bin/eccl-run" -np 2 --timeout 20 "$B/bin/sendrecv_perf" -b 1M -e 64M -f 4 -n 20 -w 3
    done
  done
}
