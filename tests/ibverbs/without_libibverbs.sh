#!/usr/bin/env bash
# libibverbs is loaded at run time: on a machine without it (here: the file
# hidden by a bind mount in a private mount namespace) the libraries still
# load, a job runs over the other back ends, and a job that requires ib
# fails at once saying why.
#
#   tests/ibverbs/without_libibverbs.sh BUILD_DIR
set -u
build=${1:?usage: $0 BUILD_DIR}
lib=$(ldconfig -p | awk '/libibverbs\.so\.1 /{print $NF; exit}')
[ -n "$lib" ] || { echo "without_libibverbs: libibverbs.so.1 is not installed: nothing to hide"; exit 77; }
command -v unshare >/dev/null && unshare --mount true 2>/dev/null ||
  { echo "without_libibverbs: cannot make a private mount namespace here (needs root and unshare)"; exit 77; }
exec unshare --mount bash -s "$build" "$lib" <<'INNER'
set -u
build=$1 lib=$2
mount --bind /dev/null "$(realpath "$lib")" || { echo "without_libibverbs: cannot bind-mount over $lib here"; exit 77; }
export ECCL_SOCKET_IFNAME=lo
run() { timeout -k 5 60 "$build/bootstrap/eccl-run" -np 2 --timeout 30 "$build/perf/sendrecv_perf" -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 2>&1; }
out=$(ECCL_TRANSPORT=auto run) || { echo "FAIL: the job did not run over the other back ends:"; echo "$out"; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: results missing or wrong:"; echo "$out"; exit 1; }
echo "ok: ECCL_TRANSPORT=auto ran without libibverbs"
out=$(ECCL_TRANSPORT=ib run) && { echo "FAIL: a job that requires ib ran without libibverbs:"; echo "$out"; exit 1; }
echo "$out" | grep -q "libibverbs.so.1 cannot be loaded" ||
  { echo "FAIL: the error does not say libibverbs is missing:"; echo "$out"; exit 1; }
echo "ok: ECCL_TRANSPORT=ib failed naming libibverbs"
INNER
