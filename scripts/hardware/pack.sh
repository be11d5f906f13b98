#!/usr/bin/env bash
# scripts/hardware.sh pack [--build DIR] [--out DIR]: builds, here, exactly
# what the GPU stages run (Release; CUDA code for sm_90 with compute_90 PTX;
# the CUDA runtime linked in; NCCL linked by its soname, libnccl.so.2, so
# the machine's own is used there) and writes the bundle: bin/, lib/ (our
# libraries and every other one the binaries need beyond glibc, libstdc++,
# the CUDA driver and NCCL, each found with ldd and loaded through $ORIGIN
# run paths), include/eccl.h and manifest.txt. Default: build-hw/ -> hw-bundle/.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/hardware/stages.sh
source scripts/hardware/elf.sh
build=build-hw out=hw-bundle
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "hardware.sh pack: unknown argument '$1' (--build DIR, --out DIR)" >&2; exit 2 ;;
  esac
done
limit_bytes=$((48 << 20))
for tool in cmake ninja nvcc patchelf ldd strip; do
  command -v "$tool" >/dev/null || { echo "hardware.sh pack: needs $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done

echo "pack: configuring $build"
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DECCL_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DECCL_CUDA_RUNTIME=Static -DECCL_WITH_MPI=OFF -DECCL_WITH_GLOO=OFF -DECCL_WITH_TORCH=OFF -DECCL_WITH_FUZZ=OFF \
  >"$build/pack-configure.log" 2>&1 || { cat "$build/pack-configure.log"; exit 1; }
grep -q 'device_perf .* is not built' "$build/pack-configure.log" &&
  { echo "hardware.sh pack: NCCL (nccl.h, libnccl) not found: the nccl and device stages would have nothing" >&2; exit 1; }

declare -A files=()
for stage in "${hw_stage_order[@]}"; do
  for f in ${hw_stage_files[$stage]}; do files[$f]=1; done
done
targets=()
for f in "${!files[@]}"; do
  t=$(hw_target_of "$f")
  [ -n "$t" ] && targets+=("$t")
done
echo "pack: building ${#targets[@]} targets in $build"
# ECCL_HW_JOBS: ninja's jobs (the CI test leaves the other core to the tests beside it).
ninja -C "$build" ${ECCL_HW_JOBS:+-j"$ECCL_HW_JOBS"} "${targets[@]}" >"$build/pack-build.log" 2>&1 ||
  { tail -40 "$build/pack-build.log"; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/include"
for f in "${!files[@]}"; do
  name=${f##*/}
  if [ "$name" = eccl.h ]; then
    cp include/eccl.h "$out/include/"
    continue
  fi
  src=$(find "$build" -path "$build/layers" -prune -o \( -type f -o -type l \) -name "$name" -print | head -1)
  [ -n "$src" ] || { echo "hardware.sh pack: $build has no $name (target $(hw_target_of "$f"))" >&2; exit 1; }
  cp -L "$src" "$out/$f"
done
# Every library the shipped files need that a bare machine lacks, and then
# what those need, until nothing new turns up.
while :; do
  added=0
  while read -r name path; do
    [ -e "$out/lib/$name" ] && continue
    cp -L "$path" "$out/lib/$name"
    added=1
  done < <(elf_files "$out" | xargs -r ldd 2>/dev/null | elf_foreign_deps "$out")
  [ $added -eq 1 ] || break
done
for f in $(elf_files "$out"); do
  strip --strip-unneeded "$f" 2>/dev/null || true
  case $f in
    "$out"/bin/*) patchelf --set-rpath '$ORIGIN/../lib' "$f" ;;
    *) patchelf --set-rpath '$ORIGIN' "$f" ;;
  esac
done
ln -sf libeccl.so.0 "$out/lib/libeccl.so"

scripts/hardware/closure.sh "$out"
bytes=$(du -sb "$out" | cut -f1)
[ "$bytes" -le "$limit_bytes" ] ||
  { echo "hardware.sh pack: $out is $bytes bytes, over the $limit_bytes a lent machine takes" >&2; exit 1; }
scripts/hardware/manifest.sh "$out" "$build" >"$out/manifest.txt"
echo "pack: $out is $((bytes >> 10)) KiB ($(find "$out" -type f | wc -l) files); manifest: $out/manifest.txt"
