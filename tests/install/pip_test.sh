#!/usr/bin/env bash
# torch_eccl as a PyTorch user installs it: a fresh virtual environment that
# has torch, `pip install --no-build-isolation <repository>`, then, from
# outside the repository, the installed package and its console scripts:
# two processes under torchrun-style env:// rendezvous allreduce through
# init_process_group("eccl"), and the same under the installed eccl-run.
#   pip_test.sh SOURCE_DIR PROJECT_PYTHON [C_COMPILER CXX_COMPILER]
# The build tree pip makes sits in SOURCE_DIR beside the project's own, and
# names the compilers that one used: with ccache (cmake/EcclCcache.cmake)
# the files compiled for the project's build are not compiled again.
# PROJECT_PYTHON's torch (the pinned one scripts/setup.sh installs, about
# 2.5 GB) is made visible to the fresh environment by a .pth file rather
# than downloaded again; everything else is installed there by pip.
set -euo pipefail
src=$(cd "$1" && pwd) project_python=$2
compilers=()
[ $# -ge 4 ] && compilers=(--config-settings=cmake.define.CMAKE_C_COMPILER="$3"
                           --config-settings=cmake.define.CMAKE_CXX_COMPILER="$4")
work=$(mktemp -d)
build=$(mktemp -d "$src/build-pip-test.XXXXXX")
trap 'rm -rf "$work" "$build"' EXIT
base=$("$project_python" -c 'import sys; print(sys.base_prefix)')
"$base/bin/python3" -m venv "$work/venv"
py=$work/venv/bin/python
torch_site=$("$project_python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" >"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/project_torch.pth"
"$py" -m pip install -q --disable-pip-version-check "scikit-build-core==1.1.2"
echo "pip: building torch_eccl from $src"
start=$SECONDS
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --config-settings=build-dir="$build" "${compilers[@]}" "$src" >"$work/pip.log" 2>&1 ||
  { echo "FAIL: pip install"; tail -60 "$work/pip.log"; exit 1; }

echo "pip: built and installed in $((SECONDS - start)) s"
cd "$work"  # not the repository: only the installed package can be found
"$py" - <<'PY'
import os, torch_eccl
where = os.path.dirname(torch_eccl.__file__)
assert "/venv/" in where, f"torch_eccl came from {where}, not the fresh environment"
assert os.path.exists(os.path.join(where, "bin", "ecclcoord")), os.listdir(where)
print("pip: torch_eccl", torch_eccl._C.version(), "installed at", where)
PY
cat >"$work/allreduce.py" <<'PY'
import os, sys
import torch, torch.distributed as dist
import torch_eccl
if os.environ.get("ECCL_UNIQUE_ID"):
    torch_eccl.init_process_group()          # under eccl-run
else:
    dist.init_process_group("eccl")          # env:// (torchrun's variables)
t = torch.full((1000,), float(dist.get_rank() + 1))
dist.all_reduce(t)
n = dist.get_world_size()
assert torch.all(t == n * (n + 1) / 2), t[:4]
print(f"rank {dist.get_rank()} of {n}: allreduce ok ({t[0].item():g})", flush=True)
dist.destroy_process_group()
PY
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 ECCL_SOCKET_IFNAME=lo timeout 120 "$py" allreduce.py &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL: a rank of the env:// run failed"; exit 1; }; done
out=$(ECCL_SOCKET_IFNAME=lo "$work/venv/bin/eccl-run" -np 2 --timeout 120 "$py" allreduce.py 2>&1) ||
  { echo "$out"; echo "FAIL: the installed eccl-run"; exit 1; }
echo "$out" | grep "allreduce ok"
[ "$(grep -c 'allreduce ok (3)' <<<"$out")" -eq 2 ] || { echo "$out"; echo "FAIL: eccl-run output"; exit 1; }
"$work/venv/bin/ecclcoord" --help >/dev/null
echo "pip: ok"
