#!/usr/bin/env bash
# Level 3: an eccl job launched by Open MPI's mpirun (the MPI build
# broadcasts the unique id). Usage: mpirun_test.sh MPIRUN PERF_BINARY
set -uo pipefail
mpirun=$1
binary=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ECCL_SOCKET_IFNAME=lo
out=$("$mpirun" -np 4 --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo \
      --mca oob_tcp_if_include lo "$binary" -b 1K -e 1M -f 8 -n 3 -w 1 -c 1 2>&1)
status=$?
echo "$out"
if [[ $status -ne 0 ]]; then
  echo "mpirun_test: mpirun exited with status $status" >&2
  exit 1
fi
grep -q "nranks 4" <<<"$out" || { echo "mpirun_test: the job did not report 4 ranks" >&2; exit 1; }
grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "mpirun_test: wrong results" >&2; exit 1; }
