#!/usr/bin/env bash
# scripts/torch_compat.sh [VERSION] [SUITE...]: torch_eccl against another
# torch than the pinned one (default 2.11.0, the GPU machines' torch): a
# virtual environment .venv-torchVERSION with that torch, torch_eccl
# configured on its own (cmake -S python, as scripts/hardware.sh builds it
# there) against build/'s libeccl, and PyTorch suites run on it (default:
# ops, async_errors, snapshot, pipeline_snapshot, ddp_example, c10d_compat,
# cuda; elastic and sandbox need torch >= 2.14: docs/pytorch.md).
# Needs build/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.11.0}
[ $# -eq 0 ] || shift
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(ops async_errors snapshot pipeline_snapshot ddp_example c10d_compat cuda)
venv=.venv-torch$version
lib=build/src/libeccl.so.0
[ -e "$lib" ] || { echo "torch_compat: no $lib (run scripts/build.sh first)" >&2; exit 2; }
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "torch_compat: installing torch==$version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$version" numpy pytest
fi
build=build-torch$version
cmake -S python -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DECCL_LIBRARY="$PWD/$lib" \
  -DECCL_PYTHON="$PWD/$venv/bin/python" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -E '^-- eccl' "$build.configure.log" || true
ninja -C "$build" -j"$(nproc)"
"$venv/bin/python" - "$build/python" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch, torch_eccl
print(f"torch_compat: torch {torch.__version__}: torch_eccl imports; c10d reconfigure "
      f"{'built in' if torch_eccl._C.has_reconfigure else 'compiled out'}")
PY
files=()
for s in "${suites[@]}"; do files+=("python/tests/test_$s.py"); done
PYTHONPATH="$PWD/$build/python" ECCL_BUILD_DIR="$PWD/build" ECCL_SOCKET_IFNAME=lo \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}"
echo "torch_compat: torch $version: torch_eccl builds and ${suites[*]} pass"
