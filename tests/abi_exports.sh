#!/usr/bin/env bash
# Every function eccl.h declares leaves libeccl.so (src/api/eccl.map lists
# them; a call missing there links in-tree and fails in users' programs).
# Usage: abi_exports.sh <eccl.h> <libeccl.so>
set -euo pipefail
header=$1 lib=$2
declared=$(grep -oE '^[A-Za-z_][A-Za-z0-9_ *]*[ *](eccl[A-Z][A-Za-z0-9]*)\(' "$header" |
  sed -E 's/.*[ *](eccl[A-Za-z0-9]*)\($/\1/' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
count=$(echo "$declared" | wc -l)
if [[ -n $missing ]]; then
  echo "declared in $header but not exported by $lib (add them to src/api/eccl.map):" >&2
  echo "$missing" >&2
  exit 1
fi
[[ $count -ge 50 ]] || { echo "only $count declarations found in $header: the pattern is broken" >&2; exit 1; }
echo "all $count functions of $header are exported"
