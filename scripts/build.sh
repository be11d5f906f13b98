#!/usr/bin/env bash
# build.sh [DIR [extra cmake args...]]: configure and build (Release by default).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
grep -E '^-- eccl' "$dir.configure.log" || true
ninja -C "$dir" -j"$(nproc)"
