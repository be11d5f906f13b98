# The GPU machine's stages, in order of value: what each runs from the
# bundle, what it needs of the machine, and its share of the run's time.
# Sourced by pack.sh (what to build and ship) and run.sh (what to run).
# Binaries are named by the file the bundle holds (bin/ or lib/).

hw_stage_order=(cuda device nccl dispatch gpu_snapshot torch reconfig logs snapshots copyhelp)

declare -A hw_stage_title=(
  [cuda]="CUDA kernels against their CPU references"
  [device]="collectives on device buffers (the stream path) against the host path"
  [nccl]="real NCCL over eccl's net plugin against NCCL's own sockets; pooled re-creation; the preload shim with a rank killed"
  [dispatch]="the CUDA MoE dispatcher (permute, combine) against a device-to-device copy"
  [gpu_snapshot]="peer-memory snapshots of device buffers"
  [torch]="torch_eccl built against this machine's torch; CUDA tensors through it"
  [reconfig]="reconfiguration: downtime flat in N, migration against full init, preparation interference"
  [logs]="the boundary-send log's tee and replay, two ranks on cores of their own"
  [snapshots]="snapshots beside an allreduce with cores to spare; an eager standby's sandbox recording"
  [copyhelp]="four TCP lanes a peer: the progress thread copying lanes beside the caller, on and off"
)

declare -A hw_stage_files=(
  [cuda]="bin/moe_cuda_test bin/reduce_cuda_test"
  [device]="bin/device_collectives_test bin/device_perf bin/eccl-run"
  [nccl]="bin/nccl_net_perf bin/nccl_failover bin/eccl-run lib/libnccl-net-eccl.so lib/libeccl-preload.so"
  [dispatch]="bin/dispatch_perf bin/eccl-run"
  [gpu_snapshot]="bin/device_collectives_test"
  [torch]="lib/libeccl.so.0 include/eccl.h"
  [reconfig]="bin/reconfig_perf bin/eccl-run"
  [logs]="bin/sendrecv_perf bin/log_perf bin/eccl-run"
  [snapshots]="bin/snapshot_perf bin/sandbox_record_perf bin/eccl-run"
  [copyhelp]="bin/sendrecv_perf bin/eccl-run"
)

# What a stage needs of the machine: gpu, nccl (a libnccl.so.2), torch (a
# python3 that imports torch), cores:N (its figures mean something only
# with N cores; with fewer it still runs, and the report says so).
declare -A hw_stage_needs=(
  [cuda]="gpu"
  [device]="gpu nccl"
  [nccl]="gpu nccl"
  [dispatch]="gpu"
  [gpu_snapshot]="gpu"
  [torch]="torch"
  [reconfig]="cores:12"
  [logs]="cores:4"
  [snapshots]="cores:6"
  [copyhelp]="cores:8"
)

# Seconds a stage may take at most; the run as a whole stops starting
# stages once its own budget is spent.
declare -A hw_stage_limit=(
  [cuda]=60 [device]=120 [nccl]=150 [dispatch]=75 [gpu_snapshot]=60 [torch]=180 [reconfig]=90 [logs]=60
  [snapshots]=90 [copyhelp]=45
)

# The CMake target behind a bundle file.
hw_target_of() {
  local name=${1##*/}
  case $name in
    libeccl.so.0) echo eccl ;;
    libnccl-net-eccl.so) echo nccl-net-eccl ;;
    libeccl-preload.so) echo eccl-preload ;;
    eccl.h) ;;
    *) echo "$name" ;;
  esac
}
