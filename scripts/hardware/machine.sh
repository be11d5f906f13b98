# What the machine has, for run.sh (sourced): a GPU, NCCL, a torch, cores;
# the report's first section, and the bundle's library check on it.

# Where the machine's libnccl.so.2 is: ECCL_HW_NCCL_DIR, else torch's
# wheel (nvidia-nccl-*), else the loader's cache.
find_nccl() {
  if [ -n "${ECCL_HW_NCCL_DIR:-}" ]; then
    echo "$ECCL_HW_NCCL_DIR"
    return
  fi
  if [ -n "$py" ]; then
    local d
    d=$("$py" -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
  fi
  ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}' | xargs -r dirname
}

probe_machine() {
  have_gpu=0 gpu_name="" py="" torch_line="" nccl_dir=""
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    have_gpu=1
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  fi
  for candidate in "${ECCL_HW_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null || continue
    torch_line=$("$candidate" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "GPU" if torch.cuda.is_available() else "no GPU")' 2>/dev/null) || continue
    py=$(command -v "$candidate")
    break
  done
  nccl_dir=$(find_nccl)
  [ -z "$nccl_dir" ] || export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  say "## The machine and the bundle"
  say ""
  say "- host: $(uname -n), $(uname -r), $cores cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  if [ "$have_gpu" = 1 ]; then
    say "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | paste -sd ';')"
  else
    say "- GPU: none (no nvidia-smi, or it lists no GPU)"
  fi
  local cxx cxx_max=""
  cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" {print $NF; exit}')
  [ -z "$cxx" ] || cxx_max=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$cxx" | sort -uV | tail -1)
  say "- glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}'), libstdc++ up to ${cxx_max:-?};" \
    "the bundle needs $(sed -n 's/^needs: //p' "$B/manifest.txt")"
  say "- python with torch: ${py:-none}${torch_line:+ (torch $torch_line)}"
  say "- NCCL: ${nccl_dir:-none found}${nccl_dir:+/libnccl.so.2}"
  if [ -n "$py" ]; then
    say "- torch's NCCL: $("$py" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null || echo unknown)"
  fi
  say "- RDMA devices: $(ls /sys/class/infiniband 2>/dev/null | paste -sd ' ' | grep . || echo none)"
  say "- cmake: $(cmake --version 2>/dev/null | head -1 || echo none); ninja: $(ninja --version 2>/dev/null || echo none); c++: $(c++ --version 2>/dev/null | head -1 || echo none)"
  say "- bundle: $(sed -n 's/^commit: //p' "$B/manifest.txt"); $(sed -n 's/^bytes: //p' "$B/manifest.txt") bytes"
  say ""
  say '```'
  scripts/hardware/closure.sh "$B" >"$logs/closure.txt" 2>&1
  local rc=$?
  cat "$logs/closure.txt" >>"$body"
  say '```'
  if [ $rc -ne 0 ]; then
    say ""
    say "**The bundle's libraries do not resolve here: the stages below will fail to start.**"
    echo "| libraries | **FAILED** (closure.txt) | 0 |" >>"$summary"
  fi
}

# Why STAGE cannot run here ("" when it can). A stage that wants cores this
# machine lacks still runs: its note says the figures are not the target's.
unmet_needs() {
  local need why=()
  for need in ${hw_stage_needs[$1]}; do
    case $need in
      gpu) [ "$have_gpu" = 1 ] || why+=("no GPU") ;;
      nccl) [ -n "$nccl_dir" ] || why+=("no libnccl.so.2 (set ECCL_HW_NCCL_DIR)") ;;
      torch) [ -n "$py" ] || why+=("no python3 that imports torch") ;;
    esac
  done
  local joined="" w
  for w in "${why[@]}"; do joined+="${joined:+; }$w"; done
  echo "$joined"
}

# The note for a stage that wants N cores: "" when the machine has them.
cores_note() {
  local need
  for need in ${hw_stage_needs[$1]}; do
    case $need in
      cores:*) [ "$cores" -ge "${need#cores:}" ] || echo "$cores cores, not ${need#cores:}: the figures are not the target's" ;;
    esac
  done
}
