#!/usr/bin/env bash
# manifest.sh DIR BUILD: the bundle's manifest on stdout: where it comes
# from, what it needs of the machine, its files, and what each stage runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/hardware/stages.sh
source scripts/hardware/elf.sh
dir=$1 build=$2
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }
nccl_h="$(cache ECCL_NCCL_INCLUDE)/nccl.h"
nccl_version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END{print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"]}' "$nccl_h")
max_version() { elf_files "$dir" | xargs grep -aoh "$1[0-9.]*[0-9]" | sort -uV | tail -1; }
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=" with uncommitted changes"

echo "eccl hardware bundle"
echo "commit: $commit$dirty ($(git log -1 --format=%s 2>/dev/null | cut -c1-72))"
echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(cc --version | head -1), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
echo "cuda: code for sm $(cache CMAKE_CUDA_ARCHITECTURES) (SASS and PTX), the runtime linked in ($(cache ECCL_CUDA_RUNTIME))"
echo "nccl: compiled against $nccl_version, loaded as libnccl.so.2: the machine's own"
echo "needs: glibc >= $(max_version GLIBC_2. | sed 's/GLIBC_//'), libstdc++ with $(max_version GLIBCXX_3.), a CUDA 13 driver for the GPU stages"
echo "bytes: $(du -sb "$dir" | cut -f1)"
echo ""
echo "files:"
(cd "$dir" && find . -type f -o -type l | sed 's|^\./||' | sort | while read -r f; do
  if [ -L "$f" ]; then printf '  %-40s -> %s\n' "$f" "$(readlink "$f")"; else printf '  %-40s %10d\n' "$f" "$(stat -c %s "$f")"; fi
done)
echo ""
echo "stages (in the order run takes them):"
for s in "${hw_stage_order[@]}"; do
  echo "  $s: ${hw_stage_title[$s]}"
  echo "    runs: ${hw_stage_files[$s]}"
  echo "    needs: ${hw_stage_needs[$s]}; at most ${hw_stage_limit[$s]} s"
done
