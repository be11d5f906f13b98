#!/usr/bin/env bash
# Installs what eccl builds and tests with (idempotent): Debian packages,
# then a project-local, git-ignored virtual environment (.venv) with the
# pinned torch, torchft and pytest the PyTorch backend is built and tested
# against (the torch wheel is large; it installs in about two minutes).
# `scripts/setup.sh peers` installs the benchmark peers perf/compare runs
# beside Open MPI and Gloo: MPICH and Intel's oneCCL (CPU), from PyPI, each
# in its own prefix under .peers (MPICH's libmpi.so.12 and the Intel MPI
# runtime oneCCL brings would collide); about 2 GiB, so not for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
peer_pins_mpich=(mpich==5.0.2)
peer_pins_oneccl=(oneccl-devel==2022.1.2 oneccl==2022.1.2 impi-rt==2021.18.1 intel-sycl-rt==2026.2.0
  intel-cmplr-lib-rt==2026.2.0 intel-cmplr-lib-ur==2026.2.0 intel-cmplr-lic-rt==2026.2.0 tcmlib==1.6.0 umf==1.2.0)
install_peers() {
  local name pins
  for name in mpich oneccl; do
    declare -n pins="peer_pins_$name"
    if [ -f ".peers/$name/.pins" ] && [ "$(cat ".peers/$name/.pins")" = "${pins[*]}" ]; then continue; fi
    echo "setup: installing ${pins[*]} into .peers/$name"
    rm -rf ".peers/$name"
    python3 -m venv ".peers/$name"
    ".peers/$name/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "${pins[@]}"
    echo "${pins[*]}" >".peers/$name/.pins"
  done
}
if [ "${1:-}" = "peers" ]; then
  install_peers
  exit 0
fi
packages=(cmake ninja-build ccache g++ clang pkg-config iproute2 procps python3 python3-venv python3-dev
  libibverbs-dev librdmacm-dev libhwloc-dev openmpi-bin libopenmpi-dev libgloo-dev
  libgtest-dev libbenchmark-dev libssl-dev libisal-dev nlohmann-json3-dev libfmt-dev
  # scripts/rdma-vm.sh: a VM with Debian's kernel and Soft-RoCE for the verbs tests
  qemu-system-x86 linux-image-amd64 busybox-static kmod cpio xz-utils ibverbs-providers ibverbs-utils
  # perf/verbs_compare: perftest beside eccl in the same VM
  perftest
  # the replicated coordinator keeps its state in etcd; its tests start a real cluster
  etcd-server
  # scripts/hardware.sh: the GPU bundle's run paths, and the bare Debian it is proved in
  patchelf debootstrap)
python_pins=(torch==2.15.0 torchft-nightly==2026.10.26 pytest==9.2.0 numpy==2.4.6 parameterized==0.9.0 expecttest==0.3.0
  matplotlib==3.11.2)
venv_ok() {
  [ -x .venv/bin/python ] && .venv/bin/python - "${python_pins[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(1)
PY
}
install_venv() {
  echo "setup: installing ${python_pins[*]} into .venv"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "${python_pins[@]}"
}
# The wheels download while apt installs, where python3 can already make
# a virtual environment (on a fresh machine both take minutes).
venv_job=""
if ! venv_ok && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  install_venv &
  venv_job=$!
fi

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -n "$venv_job" ]; then
  wait "$venv_job" || { echo "setup: installing the Python packages into .venv failed" >&2; exit 1; }
elif ! venv_ok; then
  install_venv
fi
