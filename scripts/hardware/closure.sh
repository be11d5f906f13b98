#!/usr/bin/env bash
# closure.sh DIR: fails unless every library the bundle's files need comes
# from the bundle itself, glibc, libstdc++/libgcc, or the machine's own CUDA
# driver and NCCL (which may be absent: a machine without a GPU skips the
# stages that load them), and every run path is relative ($ORIGIN).
# The caller sets LD_LIBRARY_PATH as the run will (pack clears it).
set -uo pipefail
source "$(dirname "$0")/elf.sh"
dir=$1
real=$(cd "$dir" && pwd -P)
failures=0 files=0
declare -A machine=()
for f in $(elf_files "$dir"); do
  files=$((files + 1))
  rel=${f#"$dir"/}
  if command -v readelf >/dev/null; then
    runpath=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
    for p in ${runpath//:/ }; do
      case $p in '$ORIGIN'*) ;; *) echo "closure: $rel has the run path $p (not \$ORIGIN-relative)"; failures=$((failures + 1)) ;; esac
    done
  fi
  out=$(ldd "$f" 2>&1) || { echo "closure: ldd $rel failed: $out"; failures=$((failures + 1)); continue; }
  # A library that is there but older than the one packed against.
  if grep -q 'version .* not found' <<<"$out"; then
    echo "closure: $rel: $(grep -m1 'version .* not found' <<<"$out" | sed 's/^[[:space:]]*//')"
    failures=$((failures + 1))
  fi
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if elf_machine_lib "$name"; then
      machine[$name]=$path
      continue
    fi
    if [ "$path" = "not" ]; then
      echo "closure: $rel needs $name, which is nowhere (not in the bundle, not the system's)"
      failures=$((failures + 1))
      continue
    fi
    elf_system_lib "$name" && continue
    case $(readlink -f "$path") in
      "$real"/*) ;;
      *) echo "closure: $rel loads $name from $path, outside the bundle"; failures=$((failures + 1)) ;;
    esac
  done <<<"$out"
done
[ "$files" -gt 0 ] || { echo "closure: no ELF files under $dir/bin or $dir/lib"; exit 1; }
for name in "${!machine[@]}"; do
  where=${machine[$name]}
  [ "$where" = "not" ] && where="not on this machine (the stages that load it skip)"
  echo "closure: $name is the machine's own: $where"
done
if [ "$failures" -gt 0 ]; then
  echo "closure: $failures problem(s) in $dir"
  exit 1
fi
echo "closure: $files files in $dir load only the bundle's libraries, the system's glibc and C++ runtime, and the machine's CUDA driver and NCCL"
