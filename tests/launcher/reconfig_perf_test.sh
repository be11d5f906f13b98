#!/usr/bin/env bash
# reconfig_perf end to end at small N: one JSON object per N with every key
# the elastic issue names, and the table form.
set -uo pipefail
perf=$1 launcher=$2
out=$("$perf" --sizes 4,5 --json --iterations 5 --launcher "$launcher") || { echo "FAIL: reconfig_perf --json failed"; exit 1; }
echo "$out"
[ "$(echo "$out" | grep -c '^{')" -eq 2 ] || { echo "FAIL: expected one JSON object per N"; exit 1; }
for key in n full_init_ms migrate_downtime_ms failure_detect_ms failure_recover_ms conns_opened conns_closed \
           conns_inherited qps_opened qps_closed prepare_interference_pct gloo_init_ms; do
  [ "$(echo "$out" | grep -c "\"$key\":")" -eq 2 ] || { echo "FAIL: key $key missing"; exit 1; }
done
grep -q '"n":5' <<<"$out" || { echo "FAIL: no N=5 object"; exit 1; }
# A replaced rank's delta is a few connections, never zero (the joiner must be reachable).
grep -q '"conns_opened":0,' <<<"$out" && { echo "FAIL: a migration opened no connection"; exit 1; }
table=$("$perf" --sizes 4 --iterations 5 --launcher "$launcher") || { echo "FAIL: table run failed"; exit 1; }
echo "$table"
grep -qE '^ +4 ' <<<"$table" || { echo "FAIL: no N=4 row in the table"; exit 1; }
echo "reconfig_perf: ok"
