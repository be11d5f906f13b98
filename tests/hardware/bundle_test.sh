#!/usr/bin/env bash
# bundle_test.sh SOURCE: the GPU machine's bundle cannot rot unnoticed.
# `scripts/hardware.sh pack` in a build tree beside the project's (so it
# shares the checkout's compiler cache), the bundle moved elsewhere (its run
# paths are $ORIGIN-relative), its library check there with no
# LD_LIBRARY_PATH, and `run` from it with a PATH of the tools a bare Debian
# has: the stages that need a GPU must skip saying so (or pass, on a
# machine with one), the CPU stages must pass. The whole proof in a bare
# Debian is `scripts/hardware.sh chroot` (docs/hardware.md).
set -euo pipefail
src=$1
build=$(mktemp -d "$src/build-hw-test.XXXXXX")
tmp=$(mktemp -d)
trap 'rm -rf "$build" "$tmp"' EXIT
ECCL_HW_JOBS=${ECCL_HW_JOBS:-1} "$src/scripts/hardware.sh" pack --build "$build" --out "$tmp/packed"
mv "$tmp/packed" "$tmp/bundle"
env -u LD_LIBRARY_PATH "$src/scripts/hardware.sh" check "$tmp/bundle"

# A PATH of what debootstrap's minbase holds (and nothing that the run
# would find only on a developer's machine: no python, cmake or compiler).
mkdir "$tmp/path"
for tool in bash sh env cat cp mv rm mkdir mktemp ls ln head tail sed awk grep sort uniq wc tr cut paste xargs find \
  date sleep timeout nproc uname id getconf ldd ldconfig readlink dirname basename stat du tar gzip tee kill ps; do
  p=$(command -v "$tool" || true)
  [ -n "$p" ] && ln -s "$p" "$tmp/path/$tool"
done
rc=0
env -i PATH="$tmp/path" HOME="$tmp" TMPDIR="$tmp" bash "$src/scripts/hardware.sh" run --bundle "$tmp/bundle" \
  --out "$tmp/out" --budget 300 cuda device nccl dispatch gpu_snapshot torch reconfig logs || rc=$?
sed -n '/^| stage/,/^$/p' "$tmp/out/report.md"
[ -s "$tmp/out/logs.tar.gz" ] || { echo "FAIL: no logs.tar.gz"; exit 1; }
[ "$rc" -eq 0 ] || { echo "FAIL: run exited $rc"; cat "$tmp/out/report.md"; exit 1; }
for stage in cuda device nccl dispatch gpu_snapshot; do
  grep -qE "^\| $stage \| (passed|skipped: no GPU)" "$tmp/out/report.md" ||
    { echo "FAIL: stage $stage neither passed nor skipped for want of a GPU"; cat "$tmp/out/report.md"; exit 1; }
done
grep -qE '^\| torch \| skipped: no python3 that imports torch' "$tmp/out/report.md" ||
  { echo "FAIL: the torch stage ran on a PATH without python"; exit 1; }
for stage in reconfig logs; do
  grep -qE "^\| $stage \| passed" "$tmp/out/report.md" || { echo "FAIL: stage $stage did not pass"; cat "$tmp/out/report.md"; exit 1; }
done
echo "bundle_test: packed, moved, every library found, the stages ran from the bundle"
